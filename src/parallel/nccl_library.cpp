#include "parallel/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/error.h"

namespace tetra::parallel {
namespace {

template <typename Fn>
void resolve(void* handle, const std::string& path, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  TETRA_CHECK(fn, path, " has no ", name, ": it is not an NCCL 2 library");
}

NcclLibrary load() {
  const char* env = std::getenv("TETRA_NCCL_LIBRARY");
  NcclLibrary lib;
  lib.path = env && *env ? env : "libnccl.so.2";
  // Kept for the process: communicators may outlive any one caller.
  void* handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    fail("--tp/--ep over several GPUs needs NCCL, and ", lib.path, " could not be loaded (", why ? why : "no reason given",
         "); install it (the CUDA toolkit's libnccl, or pip's nvidia-nccl-cu13) or name the file in TETRA_NCCL_LIBRARY");
  }
  resolve(handle, lib.path, "ncclGetVersion", lib.get_version);
  resolve(handle, lib.path, "ncclGetErrorString", lib.get_error_string);
  resolve(handle, lib.path, "ncclCommInitAll", lib.comm_init_all);
  resolve(handle, lib.path, "ncclGetUniqueId", lib.get_unique_id);
  resolve(handle, lib.path, "ncclCommInitRank", lib.comm_init_rank);
  resolve(handle, lib.path, "ncclGroupStart", lib.group_start);
  resolve(handle, lib.path, "ncclGroupEnd", lib.group_end);
  resolve(handle, lib.path, "ncclCommDestroy", lib.comm_destroy);
  resolve(handle, lib.path, "ncclCommAbort", lib.comm_abort);
  resolve(handle, lib.path, "ncclAllReduce", lib.all_reduce);
  resolve(handle, lib.path, "ncclAllGather", lib.all_gather);
  lib.comm_revoke = reinterpret_cast<decltype(lib.comm_revoke)>(dlsym(handle, "ncclCommRevoke"));
  TETRA_CHECK(lib.get_version(&lib.version) == ncclSuccess, lib.path, ": ncclGetVersion failed");
  // The bfloat16 type (NCCL 2.10) is the newest thing tetra asks of it.
  TETRA_CHECK(lib.version >= 21000, lib.path, " is NCCL ", lib.version, "; tetra needs 2.10 or later");
  return lib;
}

}  // namespace

const NcclLibrary& nccl_library() {
  // A failed load is not cached: the next caller gets the same sentence, from a fresh try.
  static std::mutex mu;
  static std::unique_ptr<NcclLibrary> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) loaded = std::make_unique<NcclLibrary>(load());
  return *loaded;
}

}  // namespace tetra::parallel
