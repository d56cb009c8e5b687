#include "engine/format/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "engine/util/coding.h"

namespace ckptfs {
namespace {

using json = nlohmann::json;

Status Bad(const std::string& message) { return Status::Corruption("safetensors: " + message); }

// A name from the header, quoted for a message, and cut short when long.
std::string Quote(std::string_view name) {
  constexpr size_t kMax = 100;
  std::string s = "'";  // appended one by one: GCC 12 -O3 warns wrongly about "x" + std::string
  s.append(name.substr(0, kMax));
  return s.append(name.size() > kMax ? "...'" : "'");
}

// Builds the index from the header's SAX events, checking the shape of the JSON as it goes.
// Every handler returns false (which stops the parse) after setting error_.
class HeaderReader {
 public:
  bool null() { return Scalar(Value::kNull); }
  bool boolean(bool) { return Scalar(Value::kOther); }
  bool number_integer(json::number_integer_t) { return Scalar(Value::kOther); }
  bool number_unsigned(json::number_unsigned_t v) {
    if (skip_ > 0 || level_ != Level::kArray) return Scalar(Value::kOther);
    std::vector<uint64_t>& to = field_ == Field::kShape ? tensor_.shape : offsets_;
    if (field_ == Field::kDataOffsets && offsets_.size() == 2) {
      return Fail("data_offsets of tensor " + Quote(tensor_.name) + " has more than 2 entries");
    }
    to.push_back(v);
    return true;
  }
  bool number_float(json::number_float_t, const json::string_t&) { return Scalar(Value::kOther); }
  bool string(json::string_t& s) {
    if (skip_ > 0) return true;
    if (level_ == Level::kMetadata) {
      metadata_.emplace(std::move(key_), std::move(s));
      return true;
    }
    if (level_ == Level::kTensor && field_ == Field::kDtype) {
      std::optional<DType> t = DTypeFromSafetensorsName(s);
      if (!t) return Fail("tensor " + Quote(tensor_.name) + " has an unknown dtype " + Quote(s));
      tensor_.dtype = *t;
      return true;
    }
    return Scalar(Value::kOther);
  }
  bool binary(json::binary_t&) { return Scalar(Value::kOther); }

  bool start_object(size_t) {
    if (skip_ > 0 || (level_ == Level::kTensor && field_ == Field::kOther)) return Skip();
    switch (level_) {
      case Level::kStart:
        level_ = Level::kTop;
        return true;
      case Level::kTop:
        if (key_ == "__metadata__") {
          level_ = Level::kMetadata;
          return true;
        }
        level_ = Level::kTensor;
        tensor_ = SafetensorsTensor{.name = std::move(key_)};
        offsets_.clear();
        seen_ = 0;
        return true;
      default:
        return Scalar(Value::kOther);
    }
  }
  bool key(json::string_t& k) {
    if (skip_ > 0) return true;
    if (level_ == Level::kTop) {
      if (!names_.insert(k).second) return Fail(Quote(k) + " is in the header twice");
    } else if (level_ == Level::kMetadata) {
      if (metadata_.contains(k))
        return Fail("metadata key " + Quote(k) + " is in the header twice");
    } else if (level_ == Level::kTensor) {
      field_ = k == "dtype"          ? Field::kDtype
               : k == "shape"        ? Field::kShape
               : k == "data_offsets" ? Field::kDataOffsets
                                     : Field::kOther;
      const unsigned bit = 1u << static_cast<unsigned>(field_);
      if (field_ != Field::kOther && (seen_ & bit)) {
        return Fail("tensor " + Quote(tensor_.name) + " has " + Quote(k) + " twice");
      }
      seen_ |= bit;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (skip_ > 0) return Unskip();
    switch (level_) {
      case Level::kTop:
        level_ = Level::kEnd;
        return true;
      case Level::kMetadata:
        level_ = Level::kTop;
        return true;
      case Level::kTensor:
        return EndTensor();
      default:
        return Fail("unexpected end of object");  // not reached: the parser pairs them
    }
  }
  bool start_array(size_t) {
    if (skip_ > 0 || (level_ == Level::kTensor && field_ == Field::kOther)) return Skip();
    if (level_ == Level::kTensor && (field_ == Field::kShape || field_ == Field::kDataOffsets)) {
      level_ = Level::kArray;
      return true;
    }
    return Scalar(Value::kOther);
  }
  bool end_array() {
    if (skip_ > 0) return Unskip();
    level_ = Level::kTensor;  // only kArray has arrays that are not skipped
    return true;
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
    return Fail("JSON does not parse at byte " + std::to_string(position) + ": " + e.what());
  }

  const std::string& error() const { return error_; }
  bool complete() const { return level_ == Level::kEnd; }
  std::vector<SafetensorsTensor>& tensors() { return tensors_; }
  std::vector<std::pair<uint64_t, uint64_t>>& offsets() { return ranges_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }

 private:
  enum class Level { kStart, kTop, kMetadata, kTensor, kArray, kEnd };
  enum class Field : unsigned { kDtype, kShape, kDataOffsets, kOther };
  enum class Value { kNull, kOther };

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  // A scalar (or a container where none belongs).
  bool Scalar(Value v) {
    if (skip_ > 0) return true;
    switch (level_) {
      case Level::kStart:
        return Fail("the header is not a JSON object");
      case Level::kTop:
        if (key_ == "__metadata__" && v == Value::kNull) return true;
        return Fail(Quote(key_) + " is not an object");
      case Level::kMetadata:
        return Fail("metadata " + Quote(key_) + " is not a string");
      case Level::kTensor:
        if (field_ == Field::kOther) return true;  // ignored, as the library does
        return Fail("tensor " + Quote(tensor_.name) + " has a malformed " + Quote(key_));
      case Level::kArray:
        return Fail("tensor " + Quote(tensor_.name) + " has a " + Quote(key_) +
                    " entry that is not an unsigned integer");
      case Level::kEnd:
        break;
    }
    return Fail("unexpected JSON after the header");  // not reached: the parser is strict
  }
  bool Skip() {
    ++skip_;
    return true;
  }
  bool Unskip() {
    --skip_;
    return true;
  }
  bool EndTensor() {
    constexpr unsigned kAll = (1u << static_cast<unsigned>(Field::kDtype)) |
                              (1u << static_cast<unsigned>(Field::kShape)) |
                              (1u << static_cast<unsigned>(Field::kDataOffsets));
    if ((seen_ & kAll) != kAll) {
      return Fail("tensor " + Quote(tensor_.name) + " lacks dtype, shape or data_offsets");
    }
    if (offsets_.size() != 2) {
      return Fail("data_offsets of tensor " + Quote(tensor_.name) + " does not have 2 entries");
    }
    ranges_.emplace_back(offsets_[0], offsets_[1]);
    tensors_.push_back(std::move(tensor_));
    level_ = Level::kTop;
    return true;
  }

  Level level_ = Level::kStart;
  size_t skip_ = 0;  // depth inside an ignored member's value
  std::string key_;  // the last key
  Field field_ = Field::kOther;
  unsigned seen_ = 0;  // the fields of the tensor being read
  SafetensorsTensor tensor_;
  std::vector<uint64_t> offsets_;
  std::unordered_set<std::string> names_;
  std::vector<SafetensorsTensor> tensors_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // data_offsets, one per tensor
  std::map<std::string, std::string> metadata_;
  std::string error_;
};

}  // namespace

Result<size_t> SafetensorsHeaderBytes(Bytes file_prefix) {
  if (file_prefix.size() < 8) return size_t{8};
  const uint64_t n = GetLE<uint64_t>(file_prefix.data());
  if (n > kMaxSafetensorsHeaderBytes) {
    return Bad("header of " + std::to_string(n) + " bytes, over the limit of " +
               std::to_string(kMaxSafetensorsHeaderBytes));
  }
  return static_cast<size_t>(8 + n);
}

Result<SafetensorsIndex> ParseSafetensorsHeader(Bytes file_prefix) {
  CKPTFS_ASSIGN_OR_RETURN(size_t need, SafetensorsHeaderBytes(file_prefix));
  if (file_prefix.size() < need) {
    return Bad("truncated: the header needs " + std::to_string(need) + " bytes, " +
               std::to_string(file_prefix.size()) + " given");
  }
  SafetensorsIndex index;
  index.header_bytes = need - 8;
  index.data_begin = need;
  const std::string_view header = AsChars(file_prefix.subspan(8, need - 8));
  if (!header.starts_with('{')) return Bad("the header does not start with '{'");

  HeaderReader reader;
  const bool parsed = json::sax_parse(header.begin(), header.end(), &reader,
                                      json::input_format_t::json, /*strict=*/true,
                                      /*ignore_comments=*/false);
  if (!parsed || !reader.complete()) {
    return Bad(reader.error().empty() ? "the header is not a JSON object" : reader.error());
  }

  std::vector<SafetensorsTensor>& tensors = reader.tensors();
  const std::vector<std::pair<uint64_t, uint64_t>>& ranges = reader.offsets();
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(ranges[a], tensors[a].name) < std::tie(ranges[b], tensors[b].name);
  });
  uint64_t expect = 0;  // where the next tensor must start, relative to data_begin
  index.tensors.reserve(tensors.size());
  for (size_t i : order) {
    SafetensorsTensor& t = tensors[i];
    const auto [begin, end] = ranges[i];
    if (begin != expect || end < begin) {
      return Bad("tensor " + Quote(t.name) + " has data_offsets [" + std::to_string(begin) + ", " +
                 std::to_string(end) + "], but the previous tensor ends at " +
                 std::to_string(expect) + " (a gap or an overlap)");
    }
    uint64_t bytes = ElementSize(t.dtype);
    for (uint64_t d : t.shape) {
      if (__builtin_mul_overflow(bytes, d, &bytes)) {
        return Bad("tensor " + Quote(t.name) + " has a shape whose size overflows");
      }
    }
    if (bytes != end - begin) {
      return Bad("tensor " + Quote(t.name) + " has " + std::to_string(end - begin) +
                 " bytes of data, but its dtype and shape make " + std::to_string(bytes));
    }
    if (__builtin_add_overflow(begin, index.data_begin, &t.begin) ||
        __builtin_add_overflow(end, index.data_begin, &t.end)) {
      return Bad("tensor " + Quote(t.name) + " ends past 2^64");
    }
    expect = end;
    index.tensors.push_back(std::move(t));
  }
  index.data_end = index.data_begin + expect;  // checked above, when there is a tensor
  index.metadata = std::move(reader.metadata());
  return index;
}

}  // namespace ckptfs
