// The CUDA backend (backend.h): a pinned ring (cudaHostAlloc), per device one non-blocking
// stream for the copies and one for the fingerprint kernel, and cudaMemcpyAsync of changed runs
// only; a host function queued behind each copy reports that its bytes landed.
//
// Measured on an H200 (scripts/gpu_check.sh, docs/snapshot.md): the copy stream must never
// wait, so (1) fingerprints run on their own stream (waiting for tensor i+1's fingerprints does
// not wait for tensor i's copies), and (2) the host function only queues the copy's id; the
// engine's callback (which hands every block of the run to the persist workers) runs on the
// backend's completion thread, not inside the stream, which a host function blocks until it
// returns.
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "engine/snapshot/backend.h"
#include "engine/snapshot/cuda/fingerprint_kernel.cuh"

namespace ckptfs::snapshot {
namespace {

Status CudaError(cudaError_t e, const std::string& what) {
  return Status::IOError(what + ": " + cudaGetErrorString(e));
}

class CudaBackend : public Backend {
 public:
  ~CudaBackend() override {
    (void)Drain();
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (completer_.joinable()) completer_.join();
    for (auto& [dev, st] : streams_) {
      cudaSetDevice(dev);
      cudaStreamDestroy(st.stream);
      cudaStreamDestroy(st.fp_stream);
      if (st.fps != nullptr) cudaFree(st.fps);
    }
    if (ring_ != nullptr) cudaFreeHost(ring_);
  }

  Status Init(size_t ring_bytes) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      cudaGetLastError();  // clear
      return Status::NotSupported("no CUDA device");
    }
    void* ring = nullptr;
    e = cudaHostAlloc(&ring, ring_bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) return CudaError(e, "cudaHostAlloc of the staging ring");
    ring_ = static_cast<std::byte*>(ring);
    completer_ = std::thread([this] { CompleteLoop(); });
    return Status::OK();
  }

  std::string name() const override { return "cuda"; }
  std::byte* ring_memory() override { return ring_; }

  Status Fingerprints(const TensorDesc& t, uint64_t bs, std::vector<Fingerprint>* out) override {
    out->clear();
    if (t.device < 0) {
      const auto* p = static_cast<const std::byte*>(t.data);
      for (uint64_t off = 0; off < t.nbytes; off += bs) {
        out->push_back(FingerprintBlock(p + off, std::min(bs, t.nbytes - off)));
      }
      return Status::OK();
    }
    const uint64_t blocks = (t.nbytes + bs - 1) / bs;
    if (blocks == 0) return Status::OK();
    CKPTFS_ASSIGN_OR_RETURN(DeviceStream * st, StreamFor(t.device));
    if (st->fps_capacity < blocks) {
      if (st->fps != nullptr) cudaFree(st->fps);
      st->fps = nullptr;
      cudaError_t e = cudaMalloc(&st->fps, blocks * sizeof(Fingerprint));
      if (e != cudaSuccess) return CudaError(e, "cudaMalloc of fingerprints");
      st->fps_capacity = blocks;
    }
    FingerprintKernel<<<static_cast<unsigned>(blocks), kFpThreads, 0, st->fp_stream>>>(
        static_cast<const unsigned char*>(t.data), t.nbytes, bs, st->fps);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return CudaError(e, "fingerprint kernel launch");
    out->resize(blocks);
    e = cudaMemcpyAsync(out->data(), st->fps, blocks * sizeof(Fingerprint), cudaMemcpyDeviceToHost,
                        st->fp_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st->fp_stream);
    if (e != cudaSuccess) return CudaError(e, "fingerprints of " + t.name);
    return Status::OK();
  }

  Status CopyToHost(const TensorDesc& t, uint64_t offset, uint64_t n, std::byte* dst,
                    std::function<void(Status)> done) override {
    if (t.device < 0) {
      std::memcpy(dst, static_cast<const std::byte*>(t.data) + offset, n);
      done(Status::OK());
      return Status::OK();
    }
    CKPTFS_ASSIGN_OR_RETURN(DeviceStream * st, StreamFor(t.device));
    cudaError_t e = cudaMemcpyAsync(dst, static_cast<const std::byte*>(t.data) + offset, n,
                                    cudaMemcpyDeviceToHost, st->stream);
    if (e != cudaSuccess) return CudaError(e, "cudaMemcpyAsync of " + t.name);
    auto* pending = new Pending{this, 0};
    {
      std::lock_guard lock(mu_);
      pending->id = ++next_id_;
      pending_[pending->id] = std::move(done);
    }
    e = cudaLaunchHostFunc(st->stream, &CudaBackend::Landed, pending);
    if (e != cudaSuccess) {
      std::function<void(Status)> cb = Take(pending->id);
      delete pending;
      if (cb) cb(CudaError(e, "cudaLaunchHostFunc"));
    }
    return Status::OK();
  }

  Status Drain() override {
    cudaError_t first = cudaSuccess;
    for (auto& [dev, st] : streams_) {
      cudaSetDevice(dev);
      cudaError_t e = cudaStreamSynchronize(st.stream);
      if (e != cudaSuccess && first == cudaSuccess) first = e;
    }
    if (first == cudaSuccess) {
      // Every host function ran; wait for the completion thread to run their callbacks.
      std::unique_lock lock(mu_);
      idle_cv_.wait(lock, [&] { return landed_.empty() && running_ == 0; });
      return Status::OK();
    }
    const Status result = CudaError(first, "staging copies");
    {  // copies whose host function will never run
      std::map<uint64_t, std::function<void(Status)>> left;
      {
        std::lock_guard lock(mu_);
        left.swap(pending_);
      }
      for (auto& [id, cb] : left) cb(result);
    }
    return result;
  }

 private:
  struct DeviceStream {
    cudaStream_t stream = nullptr;     // copies
    cudaStream_t fp_stream = nullptr;  // fingerprint kernels
    Fingerprint* fps = nullptr;
    uint64_t fps_capacity = 0;
  };
  struct Pending {
    CudaBackend* backend;
    uint64_t id;
  };

  // The host function behind a copy: queues its id and returns (the stream waits for it).
  static void CUDART_CB Landed(void* arg) {
    auto* p = static_cast<Pending*>(arg);
    CudaBackend* backend = p->backend;
    {
      std::lock_guard lock(backend->mu_);
      backend->landed_.push_back(p->id);
    }
    delete p;
    backend->cv_.notify_one();
  }

  // The completion thread: runs the callbacks of landed copies, in the order they landed.
  void CompleteLoop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !landed_.empty(); });
      if (landed_.empty()) return;  // stop_
      const uint64_t id = landed_.front();
      landed_.pop_front();
      auto it = pending_.find(id);
      if (it == pending_.end()) {  // failed by Drain meanwhile
        if (landed_.empty()) idle_cv_.notify_all();
        continue;
      }
      std::function<void(Status)> cb = std::move(it->second);
      pending_.erase(it);
      ++running_;
      lock.unlock();
      cb(Status::OK());
      lock.lock();
      --running_;
      if (landed_.empty() && running_ == 0) idle_cv_.notify_all();
    }
  }

  std::function<void(Status)> Take(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return nullptr;
    auto cb = std::move(it->second);
    pending_.erase(it);
    return cb;
  }

  Result<DeviceStream*> StreamFor(int device) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return CudaError(e, "cudaSetDevice(" + std::to_string(device) + ")");
    auto it = streams_.find(device);
    if (it != streams_.end()) return &it->second;
    DeviceStream st;
    e = cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st.fp_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      if (st.stream != nullptr) cudaStreamDestroy(st.stream);
      return CudaError(e, "cudaStreamCreate");
    }
    return &(streams_[device] = st);
  }

  std::byte* ring_ = nullptr;
  std::map<int, DeviceStream> streams_;  // the staging thread's only
  std::mutex mu_;
  std::condition_variable cv_;       // landed_ grew, or stop_
  std::condition_variable idle_cv_;  // landed_ empty and no callback running
  uint64_t next_id_ = 0;                                     // GUARDED_BY(mu_)
  std::map<uint64_t, std::function<void(Status)>> pending_;  // GUARDED_BY(mu_)
  std::deque<uint64_t> landed_;                              // GUARDED_BY(mu_)
  int running_ = 0;                                          // GUARDED_BY(mu_)
  bool stop_ = false;                                        // GUARDED_BY(mu_)
  std::thread completer_;
};

}  // namespace

Result<std::unique_ptr<Backend>> NewCudaBackend(size_t ring_bytes) {
  auto b = std::make_unique<CudaBackend>();
  CKPTFS_RETURN_IF_ERROR(b->Init(ring_bytes));
  return std::unique_ptr<Backend>(std::move(b));
}

bool CudaBackendBuilt() { return true; }

}  // namespace ckptfs::snapshot
