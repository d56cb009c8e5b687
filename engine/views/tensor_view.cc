#include "engine/views/tensor_view.h"

#include <nlohmann/json.hpp>

#include "engine/format/safetensors.h"
#include "engine/format/torch_pickle.h"
#include "engine/views/convert.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMaxPickleBytes = 64u << 20;

DType Presented(DType dtype, std::optional<DType> to) {
  return to && ConvertsTo(dtype, *to) ? *to : dtype;
}

bool IsCContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  int64_t expect = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

class ViewBuilder {
 public:
  ViewBuilder(TensorView* view, std::optional<DType> to) : view_(view), to_(to) {}

  // Adds one tensor whose elements are read by `add_data`.
  template <typename AddData>
  void Add(std::string_view name, DType dtype, std::vector<uint64_t> shape, AddData add_data) {
    std::string file = EscapeTensorName(name) + ".npy";
    if (file.size() > TensorView::kMaxNameBytes || view_->by_file.count(file) != 0) return;
    TensorView::Entry e;
    e.name = std::string(name);
    e.file = file;
    e.dtype = Presented(dtype, to_);
    e.shape = std::move(shape);
    const std::string header = NpyHeader(e.dtype, e.shape);
    e.npy.AddBytes(header);
    add_data(e.npy, e.dtype);
    uint64_t numel = 1;
    for (uint64_t d : e.shape) numel *= d;
    index_.push_back({{"name", e.name},
                      {"file", e.file},
                      {"dtype", std::string(DTypeName(e.dtype))},
                      {"shape", e.shape},
                      {"bytes", numel * ElementSize(e.dtype)},
                      {"header_bytes", header.size()}});
    view_->by_file.emplace(e.file, view_->tensors.size());
    view_->tensors.push_back(std::move(e));
  }

  void Finish(std::string_view format) {
    nlohmann::json doc = {{"format", format}, {"bfloat16_npy_descr", "<u2"}, {"tensors", index_}};
    view_->index.AddBytes(doc.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }

 private:
  TensorView* view_;
  std::optional<DType> to_;
  nlohmann::json index_ = nlohmann::json::array();
};

Result<std::shared_ptr<const TensorView>> BuildTorch(const SourceReader& read,
                                                     const ContentLayout& layout,
                                                     std::optional<DType> to) {
  std::string prefix;
  CKPTFS_ASSIGN_OR_RETURN(std::string pkl, ReadTorchPickle(read, layout, &prefix));
  auto index = ParseTorchPickle(AsBytes(pkl));
  if (!index.ok()) return Status::NotSupported("data.pkl: " + index.status().message());
  std::unordered_map<std::string, const TorchStorage*> storages;
  for (const TorchStorage& s : index->storages) storages.emplace(s.key, &s);
  auto view = std::make_shared<TensorView>();
  view->format = ContentLayout::Format::kTorchZip;
  ViewBuilder builder(view.get(), to);
  for (const TorchTensor& t : index->tensors) {
    auto st = storages.find(t.storage_key);
    std::string record = prefix;
    record += "data/";
    record += t.storage_key;
    const LayoutSection* section = layout.Find(record);
    if (st == storages.end() || section == nullptr || section->size != st->second->nbytes ||
        st->second->dtype != t.dtype) {
      continue;  // a tensor whose bytes cannot be located: not offered
    }
    std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
    const uint64_t base =
        section->start + static_cast<uint64_t>(t.storage_offset) * ElementSize(t.dtype);
    builder.Add(t.path, t.dtype, shape, [&](VirtualFile& f, DType presented) {
      if (IsCContiguous(t.shape, t.stride)) {
        f.AddConvert(base, t.numel, t.dtype, presented);
      } else {
        f.AddGather(StridedSource{base, t.dtype, presented, t.shape, t.stride});
      }
    });
  }
  builder.Finish("torch");
  return std::shared_ptr<const TensorView>(std::move(view));
}

Result<std::shared_ptr<const TensorView>> BuildSafetensors(const SourceReader& read, uint64_t size,
                                                           std::optional<DType> to) {
  std::string head(8, '\0');
  CKPTFS_ASSIGN_OR_RETURN(size_t got, read(0, {reinterpret_cast<std::byte*>(head.data()), 8}));
  auto need = SafetensorsHeaderBytes(AsBytes(head.substr(0, got)));
  if (!need.ok() || *need > size || *need > kMaxPickleBytes + 8) {
    return Status::NotSupported("not a safetensors file");
  }
  head.resize(*need);
  CKPTFS_ASSIGN_OR_RETURN(got, read(0, {reinterpret_cast<std::byte*>(head.data()), head.size()}));
  auto index = ParseSafetensorsHeader(AsBytes(head.substr(0, got)));
  if (!index.ok() || index->data_end > size) {
    return Status::NotSupported("safetensors header: " + (index.ok() ? std::string("file too short")
                                                                     : index.status().message()));
  }
  auto view = std::make_shared<TensorView>();
  view->format = ContentLayout::Format::kSafetensors;
  ViewBuilder builder(view.get(), to);
  for (const SafetensorsTensor& t : index->tensors) {
    uint64_t numel = 1;
    for (uint64_t d : t.shape) numel *= d;
    builder.Add(t.name, t.dtype, t.shape, [&](VirtualFile& f, DType presented) {
      f.AddConvert(t.begin, numel, t.dtype, presented);
    });
  }
  builder.Finish("safetensors");
  return std::shared_ptr<const TensorView>(std::move(view));
}

}  // namespace

const VirtualFile* TensorView::Find(std::string_view name) const {
  if (name == "index.json") return &index;
  auto it = by_file.find(name);
  return it == by_file.end() ? nullptr : &tensors[it->second].npy;
}

uint64_t TensorView::memory_bytes() const {
  uint64_t n = sizeof(*this) + index.memory_bytes();
  for (const Entry& e : tensors) {
    n += sizeof(Entry) + e.name.capacity() + 2 * e.file.capacity() + 8 * e.shape.size() +
         e.npy.memory_bytes() + 64;  // + its by_file node
  }
  return n;
}

std::string_view ViewNumpyDescr(DType dtype) {
  std::string_view d = NumpyDescr(dtype);
  if (!d.empty()) return d;
  return ElementSize(dtype) == 2 ? "<u2" : "|u1";
}

std::string NpyHeader(DType dtype, const std::vector<uint64_t>& shape) {
  std::string dict = "{'descr': '";
  dict += ViewNumpyDescr(dtype);
  dict += "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += shape.size() == 1 ? "," : ", ";
  }
  dict += "), }";
  // Version 1.0: magic(6) + version(2) + uint16 length; 2.0: uint32 length.
  size_t prefix = 10;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  if (total - prefix > 0xFFFF) {
    prefix = 12;
    total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  }
  const size_t len = total - prefix;
  std::string out = "\x93NUMPY";
  out += prefix == 10 ? '\x01' : '\x02';
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xFF);
  out += dict;
  out.append(len - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

std::string EscapeTensorName(std::string_view name) {
  if (name.empty()) return "tensor";
  std::string out;
  for (char c : name) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else if (c == '\0') {
      out += "%00";
    } else {
      out += c;
    }
  }
  if (out == "index.json" || out == "." || out == "..") out = "%" + out;
  return out;
}

Result<std::string> ReadTorchPickle(const SourceReader& read, const ContentLayout& layout,
                                    std::string* archive_prefix) {
  const LayoutSection* pkl = nullptr;
  for (const LayoutSection& s : layout.sections) {
    if (SectionKey(s.name) == "data.pkl") {
      pkl = &s;
      break;
    }
  }
  if (pkl == nullptr) return Status::NotSupported("no data.pkl record");
  if (pkl->size > kMaxPickleBytes) return Status::NotSupported("data.pkl is too large for views");
  *archive_prefix = pkl->name.substr(0, pkl->name.size() - std::string_view("data.pkl").size());
  std::string bytes(static_cast<size_t>(pkl->size), '\0');
  CKPTFS_ASSIGN_OR_RETURN(
      size_t n, read(pkl->start, {reinterpret_cast<std::byte*>(bytes.data()), bytes.size()}));
  if (n != bytes.size()) return Status::Corruption("data.pkl is shorter than its layout");
  return bytes;
}

Result<std::shared_ptr<const TensorView>> BuildTensorView(
    const SourceReader& read, uint64_t size, const std::optional<ContentLayout>& layout,
    std::optional<DType> to) {
  if (layout && layout->format == ContentLayout::Format::kTorchZip) {
    return BuildTorch(read, *layout, to);
  }
  if (!layout || layout->format == ContentLayout::Format::kSafetensors ||
      layout->format == ContentLayout::Format::kNone) {
    if (size >= 8) return BuildSafetensors(read, size, to);
  }
  return Status::NotSupported("no tensor layout");
}

}  // namespace ckptfs
