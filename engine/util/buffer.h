// engine/util/buffer.h
//
// Byte spans and an owned, uninitialised byte buffer (a std::vector<std::byte> would zero
// megabytes it is about to overwrite). Buffer is move-only.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

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
  explicit Buffer(size_t size) : data_(new std::byte[size]), size_(size), capacity_(size) {}
  explicit Buffer(Bytes bytes) : Buffer(bytes.size()) {
    if (!bytes.empty()) std::memcpy(data_.get(), bytes.data(), bytes.size());
  }
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  Bytes bytes() const { return {data_.get(), size_}; }
  MutableBytes mutable_bytes() { return {data_.get(), size_}; }

  // Changes the size. Growing past capacity reallocates and keeps the first size() bytes;
  // bytes beyond the old size are uninitialised.
  void Resize(size_t size) {
    if (size > capacity_) {
      std::unique_ptr<std::byte[]> grown(new std::byte[size]);
      if (size_ > 0) std::memcpy(grown.get(), data_.get(), size_);
      data_ = std::move(grown);
      capacity_ = size;
    }
    size_ = size;
  }
  void Append(Bytes bytes) {
    size_t old = size_;
    if (old + bytes.size() > capacity_) Reserve(std::max(old + bytes.size(), capacity_ * 2));
    size_ = old + bytes.size();
    if (!bytes.empty()) std::memcpy(data_.get() + old, bytes.data(), bytes.size());
  }
  void Reserve(size_t capacity) {
    if (capacity <= capacity_) return;
    size_t keep = size_;
    Resize(capacity);
    size_ = keep;
  }
  void Clear() { size_ = 0; }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace ckptfs
