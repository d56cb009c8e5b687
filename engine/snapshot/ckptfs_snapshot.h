/* engine/snapshot/ckptfs_snapshot.h
 *
 * The C ABI of libckptfs_snapshot.so, the snapshot engine that runs inside a training process
 * (python/ckptfs/snapshot.py calls it through ctypes). docs/snapshot.md has the design.
 *
 *   char err[512];
 *   ckptfs_engine* e = ckptfs_engine_open("unix:/data/ckpt/control.sock", rank, world, NULL,
 *                                          err, sizeof err);
 *   ckptfs_tensor t = {"layer0.weight", "F32", 2, shape, ptr, -1, nbytes, NULL, NULL};
 *   ckptfs_snapshot* s = ckptfs_snapshot_start(e, "global_step100", &t, 1, err, sizeof err);
 *   ckptfs_snapshot_wait_staged(s, err, sizeof err);   // t may be modified again
 *   ckptfs_snapshot_wait(s, err, sizeof err);          // durable, visible in the mount
 *   ckptfs_snapshot_free(s);
 *   ckptfs_engine_close(e);
 *
 * Functions returning int return 0 on success, -1 with a message in err otherwise. No function
 * lets a C++ exception out. Thread-safe.
 */
#ifndef CKPTFS_SNAPSHOT_H_
#define CKPTFS_SNAPSHOT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ckptfs_engine ckptfs_engine;
typedef struct ckptfs_snapshot ckptfs_snapshot;

typedef struct {
  const char* name;
  const char* dtype; /* safetensors dtype: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL */
  int32_t ndim;
  const int64_t* shape; /* of this shard */
  const void* data;     /* contiguous host or device memory */
  int32_t device;       /* -1: host memory; >= 0: CUDA device ordinal */
  uint64_t nbytes;
  /* Partitioned tensors: the whole tensor's shape and this shard's offsets (ndim each), or
   * NULL when the tensor is not partitioned. */
  const int64_t* global_shape;
  const int64_t* offsets;
} ckptfs_tensor;

typedef struct {
  uint64_t block_bytes;    /* 0: 1 MiB */
  uint64_t ring_bytes;     /* 0: 256 MiB */
  uint64_t max_copy_bytes; /* 0: 64 MiB */
  int32_t workers;         /* 0: one per CPU */
  const char* codec;       /* NULL: "lz4"; "none", "zstd[:L]" */
  int32_t backend;         /* 0: auto (CUDA when built and present), 1: cpu, 2: cuda */
  uint32_t max_delta_chain; /* 0: 8 (the store may bound it lower); 1: no deltas */
} ckptfs_engine_options;

typedef struct {
  uint64_t tensors, blocks, blocks_unchanged, bytes, bytes_copied, records_written, record_bytes,
      chunks_deduped;
  double stage_seconds, persist_seconds, total_seconds;
  uint64_t records_delta, delta_bases_unreadable;
} ckptfs_snapshot_stats;

/* target: "unix:PATH" (the mount daemon's control socket) or "dir:PATH" (packs and commit
 * files in a plain directory; tests and benchmarks). options may be NULL. */
ckptfs_engine* ckptfs_engine_open(const char* target, int32_t rank, int32_t world_size,
                                  const ckptfs_engine_options* options, char* err, size_t errlen);
/* Waits for the snapshot in flight. */
void ckptfs_engine_close(ckptfs_engine* engine);
/* "cpu" or "cuda"; valid while the engine is. */
const char* ckptfs_engine_backend(const ckptfs_engine* engine);

/* Starts a snapshot (waits for the previous one first) and returns at once; the tensors must
 * stay unmodified until ckptfs_snapshot_wait_staged returns. The descriptors are copied. */
ckptfs_snapshot* ckptfs_snapshot_start(ckptfs_engine* engine, const char* version,
                                       const ckptfs_tensor* tensors, size_t count, char* err,
                                       size_t errlen);
/* The same, with extra entries for the safetensors file's __metadata__: metadata_json is a
 * JSON object of strings ({"ckptfs.extra": "..."}), or NULL. */
ckptfs_snapshot* ckptfs_snapshot_start_with_metadata(ckptfs_engine* engine, const char* version,
                                                     const ckptfs_tensor* tensors, size_t count,
                                                     const char* metadata_json, char* err,
                                                     size_t errlen);
int ckptfs_snapshot_wait_staged(ckptfs_snapshot* snap, char* err, size_t errlen);
/* This rank's part is durable and accepted by the daemon. */
int ckptfs_snapshot_wait_committed(ckptfs_snapshot* snap, char* err, size_t errlen);
/* The version is durable and visible (all ranks committed). */
int ckptfs_snapshot_wait(ckptfs_snapshot* snap, char* err, size_t errlen);
void ckptfs_snapshot_get_stats(const ckptfs_snapshot* snap, ckptfs_snapshot_stats* out);
/* Waits for the snapshot to finish, then frees the handle. */
void ckptfs_snapshot_free(ckptfs_snapshot* snap);

/* The block fingerprint (fingerprint.h) of len bytes of host memory: out[0] = lo, out[1] = hi. */
void ckptfs_fingerprint(const void* data, uint64_t len, uint64_t out[2]);
/* 1 when this library has the CUDA backend. */
int32_t ckptfs_cuda_built(void);

#ifdef __cplusplus
}
#endif

#endif /* CKPTFS_SNAPSHOT_H_ */
