// The C ABI over engine/snapshot/snapshot_engine.h. Every entry point catches everything: no
// exception (std::bad_alloc, std::system_error from std::thread) crosses into C.
#include "engine/snapshot/ckptfs_snapshot.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/snapshot/snapshot_engine.h"

using ckptfs::Result;
using ckptfs::Status;
namespace snap = ckptfs::snapshot;

struct ckptfs_engine {
  std::unique_ptr<snap::Engine> engine;
};
struct ckptfs_snapshot {
  std::shared_ptr<snap::Snapshot> snapshot;
};

namespace {

void SetError(char* err, size_t errlen, const std::string& msg) {
  if (err == nullptr || errlen == 0) return;
  std::snprintf(err, errlen, "%s", msg.c_str());
}

int Report(const Status& s, char* err, size_t errlen) {
  if (s.ok()) return 0;
  SetError(err, errlen, s.ToString());
  return -1;
}

Result<std::unique_ptr<snap::PersistSink>> OpenSink(const std::string& target) {
  if (target.rfind("unix:", 0) == 0) return snap::ConnectDaemon(target.substr(5));
  if (target.rfind("dir:", 0) == 0) return snap::NewDirSink(target.substr(4));
  return Status::InvalidArgument("target must be unix:SOCKET or dir:PATH, not " + target);
}

Result<snap::EngineOptions> ToOptions(const ckptfs_engine_options* o) {
  snap::EngineOptions out;
  if (o == nullptr) return out;
  if (o->block_bytes != 0) out.block_bytes = o->block_bytes;
  if (o->ring_bytes != 0) out.ring_bytes = o->ring_bytes;
  if (o->max_copy_bytes != 0) out.max_copy_bytes = o->max_copy_bytes;
  out.workers = o->workers;
  if (o->max_delta_chain != 0) out.max_delta_chain = o->max_delta_chain;
  if (o->codec != nullptr) {
    CKPTFS_ASSIGN_OR_RETURN(out.codec, ckptfs::CodecSpec::Parse(o->codec));
  }
  switch (o->backend) {
    case 0:
      out.backend = snap::BackendKind::kAuto;
      break;
    case 1:
      out.backend = snap::BackendKind::kCpu;
      break;
    case 2:
      out.backend = snap::BackendKind::kCuda;
      break;
    default:
      return Status::InvalidArgument("backend must be 0 (auto), 1 (cpu) or 2 (cuda)");
  }
  return out;
}

Result<std::vector<snap::TensorDesc>> ToTensors(const ckptfs_tensor* tensors, size_t count) {
  std::vector<snap::TensorDesc> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ckptfs_tensor& t = tensors[i];
    if (t.name == nullptr || t.dtype == nullptr || t.ndim < 0 ||
        (t.ndim > 0 && t.shape == nullptr)) {
      return Status::InvalidArgument("tensor " + std::to_string(i) +
                                     ": missing name, dtype or shape");
    }
    snap::TensorDesc d;
    d.name = t.name;
    d.dtype = t.dtype;
    d.shape.assign(t.shape, t.shape + t.ndim);
    d.data = t.data;
    d.device = t.device;
    d.nbytes = t.nbytes;
    if (t.global_shape != nullptr && t.offsets != nullptr) {
      d.global_shape.assign(t.global_shape, t.global_shape + t.ndim);
      d.offsets.assign(t.offsets, t.offsets + t.ndim);
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

extern "C" {

ckptfs_engine* ckptfs_engine_open(const char* target, int32_t rank, int32_t world_size,
                                  const ckptfs_engine_options* options, char* err, size_t errlen) {
  try {
    if (target == nullptr) {
      SetError(err, errlen, "no target");
      return nullptr;
    }
    auto opts = ToOptions(options);
    if (!opts.ok()) return Report(opts.status(), err, errlen), nullptr;
    auto sink = OpenSink(target);
    if (!sink.ok()) return Report(sink.status(), err, errlen), nullptr;
    auto engine = snap::Engine::Open(std::move(*sink), rank, world_size, *opts);
    if (!engine.ok()) return Report(engine.status(), err, errlen), nullptr;
    return new ckptfs_engine{std::move(*engine)};
  } catch (const std::exception& e) {
    SetError(err, errlen, e.what());
    return nullptr;
  }
}

void ckptfs_engine_close(ckptfs_engine* engine) {
  try {
    delete engine;
  } catch (...) {
  }
}

const char* ckptfs_engine_backend(const ckptfs_engine* engine) {
  return engine->engine->backend_name().c_str();
}

ckptfs_snapshot* ckptfs_snapshot_start(ckptfs_engine* engine, const char* version,
                                       const ckptfs_tensor* tensors, size_t count, char* err,
                                       size_t errlen) {
  return ckptfs_snapshot_start_with_metadata(engine, version, tensors, count, nullptr, err, errlen);
}

ckptfs_snapshot* ckptfs_snapshot_start_with_metadata(ckptfs_engine* engine, const char* version,
                                                     const ckptfs_tensor* tensors, size_t count,
                                                     const char* metadata_json, char* err,
                                                     size_t errlen) {
  try {
    if (version == nullptr || *version == '\0') {
      SetError(err, errlen, "no version name");
      return nullptr;
    }
    auto descs = ToTensors(tensors, count);
    if (!descs.ok()) return Report(descs.status(), err, errlen), nullptr;
    std::map<std::string, std::string> metadata;
    if (metadata_json != nullptr) {
      const auto doc = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
      if (!doc.is_object()) {
        SetError(err, errlen, "metadata is not a JSON object");
        return nullptr;
      }
      for (const auto& [key, value] : doc.items()) {
        if (!value.is_string()) {
          SetError(err, errlen, "metadata values must be strings");
          return nullptr;
        }
        metadata[key] = value.get<std::string>();
      }
    }
    auto s = engine->engine->Start(version, std::move(*descs), std::move(metadata));
    if (!s.ok()) return Report(s.status(), err, errlen), nullptr;
    return new ckptfs_snapshot{std::move(*s)};
  } catch (const std::exception& e) {
    SetError(err, errlen, e.what());
    return nullptr;
  }
}

int ckptfs_snapshot_wait_staged(ckptfs_snapshot* s, char* err, size_t errlen) {
  return Report(s->snapshot->WaitStaged(), err, errlen);
}

int ckptfs_snapshot_wait_committed(ckptfs_snapshot* s, char* err, size_t errlen) {
  return Report(s->snapshot->WaitCommitted(), err, errlen);
}

int ckptfs_snapshot_wait(ckptfs_snapshot* s, char* err, size_t errlen) {
  return Report(s->snapshot->Wait(), err, errlen);
}

void ckptfs_snapshot_get_stats(const ckptfs_snapshot* s, ckptfs_snapshot_stats* out) {
  snap::SnapshotStats st = s->snapshot->stats();
  *out = ckptfs_snapshot_stats{st.tensors,
                               st.blocks,
                               st.blocks_unchanged,
                               st.bytes,
                               st.bytes_copied,
                               st.records_written,
                               st.record_bytes,
                               st.chunks_deduped,
                               st.stage_seconds,
                               st.persist_seconds,
                               st.total_seconds,
                               st.records_delta,
                               st.delta_bases_unreadable};
}

void ckptfs_snapshot_free(ckptfs_snapshot* s) {
  try {
    if (s != nullptr) (void)s->snapshot->Wait();
    delete s;
  } catch (...) {
  }
}

void ckptfs_fingerprint(const void* data, uint64_t len, uint64_t out[2]) {
  snap::Fingerprint fp = snap::FingerprintBlock(data, len);
  out[0] = fp.lo;
  out[1] = fp.hi;
}

int32_t ckptfs_cuda_built(void) { return snap::CudaBackendBuilt() ? 1 : 0; }

}  // extern "C"
