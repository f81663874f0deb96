// The cpu device's training ops (kernels/cpu/train_ops.cpp): what the device
// hands them, and the factory CpuDevice::make_train_ops calls.
#pragma once

#include <chrono>      // std::chrono::milliseconds
#include <cstdint>     // std::uint16_t
#include <functional>  // std::function
#include <memory>      // std::shared_ptr, std::unique_ptr

#include <oneapi/dnnl/dnnl.hpp>  // dnnl::engine

#include "harness/train_ops.hpp"                  // TrainOps
#include "kernels/cpu/detail/compute_stream.hpp"  // ComputeStream
#include "kernels/cpu/detail/mem_ledger.hpp"      // MemLedger

namespace sb::cpu {

struct TrainEnv {
  dnnl::engine eng;                  // reference counted: a copy shares the engine
  ComputeStream& cs;                 // the device's stream
  std::shared_ptr<MemLedger> ledger; // every tensor and workspace is accounted here
  // The device's synchronize (a timeout is a HangError, and the device keeps
  // freed blocks from then on).
  std::function<void(std::chrono::milliseconds)> sync;
};

std::unique_ptr<TrainOps> make_train_ops(TrainEnv env);

// The fp16 conversions the ops use (bit manipulation, no F16C needed);
// exposed for the unit test that checks them against _Float16.
std::uint16_t fp16_bits_fast(float x);
float fp16_value_fast(std::uint16_t bits);

}  // namespace sb::cpu
