// Shared by the host wrappers over CuTe DSL exports (gdn_dsl_abi.cpp,
// gdn_swiglu_abi.cpp): each thread's last error message, and the hook that
// records the first CUDA error of a generated Kernel_Module_Load (which
// would only printf() it). Include this before the generated headers: they
// use CUTE_DSL_CUDA_ERROR_CHECK if it is defined. Host code only; every
// translation unit gets its own state (anonymous namespace).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "gdn_abi.h"

namespace {

thread_local char g_last_error[256] = "no error";
thread_local cudaError_t g_load_error = cudaSuccess;

int32_t fail(int32_t status, const char* detail) {
  std::snprintf(g_last_error, sizeof(g_last_error), "%s", detail);
  return status;
}

// The first CUDA error recorded since the last call (cudaSuccess if none);
// clears it.
cudaError_t take_load_error() {
  const cudaError_t e = g_load_error;
  g_load_error = cudaSuccess;
  return e;
}

// GDN_ERR_KERNEL with "loading the <what> failed: <CUDA's message>".
int32_t fail_load(const char* what, cudaError_t e) {
  char msg[200];
  std::snprintf(msg, sizeof(msg), "loading the %s failed: %s", what, cudaGetErrorString(e));
  return fail(GDN_ERR_KERNEL, msg);
}

}  // namespace

#define CUTE_DSL_CUDA_ERROR_CHECK(err)                                       \
  {                                                                          \
    cudaError_t e_ = (err);                                                  \
    if (e_ != cudaSuccess && g_load_error == cudaSuccess) g_load_error = e_; \
  }
