// engine/util/buffer.h
//
// Byte spans and an owned, uninitialised byte buffer (a std::vector<std::byte> would zero
// megabytes it is about to overwrite). Buffer is move-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string_view>
#include <utility>

namespace ckptfs {

using Bytes = std::span<const std::byte>;
using MutableBytes = std::span<std::byte>;

inline Bytes AsBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline std::string_view AsChars(Bytes b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t size) : Buffer(Allocate(size, 0), 0, size) {}
  explicit Buffer(Bytes bytes) : Buffer(bytes.size()) {
    if (!bytes.empty()) std::memcpy(data_, bytes.data(), bytes.size());
  }
  // `size` bytes that lie `lead` bytes into a block of `block_size` bytes whose start is
  // aligned to `alignment` (a power of two): for O_DIRECT reads, which fill whole aligned
  // blocks; block() is the whole block, bytes() the part the caller wanted.
  // REQUIRES: lead + size <= block_size.
  static Buffer InAlignedBlock(size_t alignment, size_t block_size, size_t lead, size_t size) {
    Buffer b(Allocate(block_size, alignment), lead, size);
    b.block_size_ = block_size;
    return b;
  }
  Buffer(Buffer&& other) noexcept
      : block_(std::move(other.block_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)),
        block_size_(std::exchange(other.block_size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    block_ = std::move(other.block_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    block_size_ = std::exchange(other.block_size_, 0);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  Bytes bytes() const { return {data_, size_}; }
  MutableBytes mutable_bytes() { return {data_, size_}; }
  // The whole allocation of an InAlignedBlock buffer (empty for others).
  MutableBytes block() { return {block_.get(), block_size_}; }

  // Changes the size. Growing past capacity reallocates and keeps the first size() bytes;
  // bytes beyond the old size are uninitialised.
  void Resize(size_t size) {
    if (size > capacity_) {
      Buffer grown(size);
      if (size_ > 0) std::memcpy(grown.data_, data_, size_);
      *this = std::move(grown);
    }
    size_ = size;
  }
  void Append(Bytes bytes) {
    size_t old = size_;
    if (old + bytes.size() > capacity_) Reserve(std::max(old + bytes.size(), capacity_ * 2));
    size_ = old + bytes.size();
    if (!bytes.empty()) std::memcpy(data_ + old, bytes.data(), bytes.size());
  }
  void Reserve(size_t capacity) {
    if (capacity <= capacity_) return;
    size_t keep = size_;
    Resize(capacity);
    size_ = keep;
  }
  void Clear() { size_ = 0; }

 private:
  // One allocator family for every block (malloc, or aligned_alloc for aligned blocks; both
  // freed with free): a deleter that chose between delete[] and free made gcc's
  // -Wmismatched-new-delete fail the -O1 sanitizer builds.
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  using Block = std::unique_ptr<std::byte, Free>;
  static Block Allocate(size_t size, size_t alignment) {
    if (size == 0) return Block(nullptr);
    // As new[] would (bad_array_new_length); it also tells gcc that malloc's argument is a
    // valid object size (-Walloc-size-larger-than where a caller's size is a difference).
    if (size > static_cast<size_t>(PTRDIFF_MAX)) throw std::bad_alloc();
    void* p = alignment == 0
                  ? std::malloc(size)
                  : std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
    if (p == nullptr) throw std::bad_alloc();  // as new[] did
    return Block(static_cast<std::byte*>(p));
  }
  Buffer(Block block, size_t lead, size_t size)
      : block_(std::move(block)),
        data_(block_ ? block_.get() + lead : nullptr),
        size_(size),
        capacity_(size) {}

  Block block_;
  std::byte* data_ = nullptr;  // block_ + lead
  size_t size_ = 0;
  size_t capacity_ = 0;
  size_t block_size_ = 0;  // InAlignedBlock only
};

}  // namespace ckptfs
