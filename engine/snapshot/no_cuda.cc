// Built instead of cuda/cuda_backend.cu when CMake found no CUDA toolkit.
#include "engine/snapshot/backend.h"

namespace ckptfs::snapshot {

Result<std::unique_ptr<Backend>> NewCudaBackend(size_t) {
  return Status::NotSupported("this ckptfs was built without the CUDA backend");
}
bool CudaBackendBuilt() { return false; }

}  // namespace ckptfs::snapshot
