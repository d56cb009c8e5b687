// engine/util/mutex.h
//
// Mutex, MutexLock and CondVar: std::mutex, a scoped lock and std::condition_variable with
// clang's thread-safety annotations, so that the lock a member needs is checked when compiling
// (clang -Wthread-safety; scripts/thread_safety.sh checks the whole tree):
//
//   Mutex mu_;
//   CondVar cv_;
//   int n_ GUARDED_BY(mu_) = 0;
//
//   void Add() { MutexLock lock(mu_); ++n_; cv_.NotifyAll(); }
//   void Bad() { ++n_; }        // clang: writing variable 'n_' requires holding mutex 'mu_'
//   void WaitPositive() {
//     MutexLock lock(mu_);
//     while (n_ == 0) cv_.Wait(lock);   // a loop, not a predicate lambda: the analysis does
//   }                                   // not carry the caller's locks into a lambda
//   void Helper() REQUIRES(mu_);         // callers must hold mu_
//
// With other compilers the annotations expand to nothing; the types behave like the std ones.
// Thread-safe as std::mutex is; a MutexLock belongs to one thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define CKPTFS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CKPTFS_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) CKPTFS_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY CKPTFS_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) CKPTFS_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) CKPTFS_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) CKPTFS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) CKPTFS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define EXCLUDES(...) CKPTFS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) CKPTFS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CKPTFS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) CKPTFS_THREAD_ANNOTATION(assert_capability(x))
#define NO_THREAD_SAFETY_ANALYSIS CKPTFS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace ckptfs {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis that the calling thread holds this mutex (checked by nothing at run
  // time): for code the analysis cannot follow.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction, except between Unlock() and Lock().
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // REQUIRES: held. For work outside the lock in the middle of a scope.
  void Unlock() RELEASE() { lock_.unlock(); }
  // REQUIRES: not held.
  void Lock() ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

class CondVar {
 public:
  // REQUIRES: `lock` held. Releases it while waiting; may wake spuriously (wait in a loop).
  void Wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  // As Wait, for at most `timeout`. Returns false on timeout.
  template <class Rep, class Period>
  bool WaitFor(MutexLock& lock, std::chrono::duration<Rep, Period> timeout) {
    return cv_.wait_for(lock.lock_, timeout) == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ckptfs
