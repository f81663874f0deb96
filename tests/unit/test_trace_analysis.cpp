// The rules' inputs diagnose --trace reads from a profiler trace (diagnose/trace/trace_analysis): which
// kernels are GEMMs and in which dtype (kernel names from HTA's real traces, kept outside the repository
// in $STALLBENCH_SHARED_DATA/traces, and cuBLAS's, CUTLASS's and cuDNN's naming), the DataLoader's share as PyTorch records it, and the
// stream whose idle time speaks for the device.
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "readers/kineto.hpp"
#include "diagnose/trace/trace_analysis.hpp"

namespace {

using sb::readers::analyze;
using sb::readers::busiest_stream;
using sb::readers::gemm_dtype;
using sb::readers::parse_kineto;
using sb::readers::read_kineto;

TEST(TraceGemmDtype, KernelNamesOfRealTracesAndTheLibraries) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // nccl_parser_config (A100): cuDNN's batch norm and layout kernels are no GEMMs
      {"void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, float, "
       "cudnnTensorStruct, float const*)", ""},
      {"void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, float const*)", ""},
      {"void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::"
       "nchw2nhwc_params_t<float>)", ""},
      {"void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false, (cudnnKernelDataType_t)0>(cudnn::ops::"
       "nhwc2nchw_params_t<float>)", ""},
      // ... its GEMMs and convolutions: fp32 inputs on an A100's tensor cores are TF32
      {"void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_"
       "256x64_16x4_nn_align4::Params)", "tf32"},
      {"sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4", "tf32"},
      // ns_resolution (V100): fp32 SIMT GEMMs and cuDNN's convolutions
      {"volta_sgemm_64x64_nt", "f32"},
      {"cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "f32"},
      {"void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int)", "f32"},
      // timeline_analysis: FBGEMM's embedding, permute and quantize kernels are no GEMMs
      {"void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, 32ul>"
       "(at::GenericPackedTensorAccessor<c10::Half, 1ul>)", ""},
      {"void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int, int, int, int const*)", ""},
      {"void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>(float const*, float const*)", ""},
      {"ampere_sgemm_128x64_nn", "f32"},
      // cuBLAS's and CUTLASS's 16-bit GEMMs: the input type is named before the MMA shape, the "s" is the fp32
      // accumulator (these read as TF32 before 2026-12-05)
      {"ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_64x3_nn", "f16"},
      {"turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_tn", "f16"},
      {"void cutlass::Kernel<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_32x2_tn_align8>(Params)", "f16"},
      {"ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "bf16"},
      {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", "bf16"},
      {"volta_h884gemm_64x64_ldg8_nn", "f16"},
      {"sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128", "fp8"},
      // AMD (Tensile): single precision
      {"Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0", "f32"},
      // not GEMMs at all
      {"void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)", ""},
      {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ""},
  };
  for (const auto& [name, want] : cases) EXPECT_EQ(gemm_dtype(name), want) << name;
}

// A ProfilerStep with the DataLoader's __next__ in it, recorded as PyTorch records it (a Python
// record_function: user_annotation) or as older traces did (cpu_op): the loader's share counts either.
TEST(TraceSteps, TheDataLoadersNextCountsAsUserAnnotationOrCpuOp) {
  for (const std::string cat : {"user_annotation", "cpu_op"}) {
    const std::string text = R"({"traceEvents": [
      {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
      {"ph": "X", "cat": ")" + cat + R"(", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
       "pid": 1, "tid": 1, "ts": 10, "dur": 400},
      {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 1000, "dur": 1000},
      {"ph": "X", "cat": ")" + cat + R"(", "name": "enumerate(DataPipe)#IterableWrapperIterDataPipe.__next__",
       "pid": 1, "tid": 1, "ts": 1010, "dur": 100}
    ]})";
    const auto a = analyze(parse_kineto(text));
    EXPECT_EQ(a.steps.count, 2) << cat;
    EXPECT_DOUBLE_EQ(a.steps.dataloader_us, 500.0) << cat;
    EXPECT_EQ(a.steps.loader_iter, "single") << cat;
  }
}

// The loader's share as the TensorBoard plugin counts it: its time less what a kernel, copy, memset or
// CUDA runtime call covers (overall_parser's role order). Step 0-1000: __next__ 0-1000, a kernel
// 200-500, a runtime call 600-700 (inside a kernel-free stretch), a gpu_user_annotation 0-1000 (not
// work: the plugin does not count it) -> 600 us exposed of 1000.
TEST(TraceSteps, TheLoadersExposedTimeLeavesOutTheDevicesWorkAndRuntimeCalls) {
  const std::string text = R"JSON({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
    {"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
     "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 600, "dur": 100,
     "args": {"correlation": 5}},
    {"ph": "X", "cat": "kernel", "name": "volta_sgemm_64x64_nt", "pid": 0, "tid": 7, "ts": 200, "dur": 300,
     "args": {"stream": 7, "device": 0, "correlation": 4}},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "forward", "pid": 0, "tid": 7, "ts": 0, "dur": 1000,
     "args": {"stream": 7, "device": 0}}
  ]})JSON";
  const auto a = analyze(parse_kineto(text));
  EXPECT_DOUBLE_EQ(a.steps.dataloader_us, 1000.0);
  EXPECT_DOUBLE_EQ(a.steps.dataloader_exposed_us, 600.0);
  EXPECT_EQ(a.steps.loader_iter, "multi");
}

// Against the plugin itself (torch-tb-profiler 0.4.3's RunProfileData on the same file, kept beside it in
// tests/data/traces/tb_plugin): a stallbench dataloader trace (workers 0, 21 steps on a cpu device) whose
// loader runs beside the device's work. The plugin reads 71.3% DataLoader; __next__ spans 98% of the steps.
// The rest of the gap is the plugin's steps: it extends each to its kernels' end on the device and drops
// the last step, where these are the host's ProfilerStep spans.
TEST(TraceSteps, TheLoadersShareIsTheTensorBoardPluginsOnItsOwnAnswer) {
  const std::string dir = std::string(SB_TEST_DATA) + "/traces/tb_plugin";
  const auto a = analyze(read_kineto(dir + "/stallbench_dataloader_workers0.pt.trace.json.gz"));
  std::ifstream f(dir + "/tb_plugin_breakdown.json");
  const auto want = nlohmann::json::parse(f);
  const double plugin = want.at("dataloader_ratio_pct").get<double>();
  ASSERT_NEAR(plugin, 71.3, 0.05);
  ASSERT_GT(a.steps.total_us, 0);
  const double ours = 100 * a.steps.dataloader_exposed_us / a.steps.total_us;
  const double wall = 100 * a.steps.dataloader_us / a.steps.total_us;
  EXPECT_NEAR(ours, plugin, 1.5) << "wall " << wall;
  EXPECT_GT(wall - plugin, 20) << "the fixture no longer has a loader beside the device's work";
}

// The stream whose idle time speaks for the device is the one that computes the most, not NCCL's: a
// communication stream busy all along, a compute stream, and a side stream with one kernel and a long gap.
TEST(TraceIdle, TheBusiestComputeStreamSpeaksForTheDevice) {
  const std::string text = R"JSON({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "pid": 0, "tid": 9,
     "ts": 0, "dur": 900, "args": {"stream": 9, "device": 0, "correlation": 1}},
    {"ph": "X", "cat": "kernel", "name": "volta_sgemm_64x64_nt", "pid": 0, "tid": 7, "ts": 0, "dur": 100,
     "args": {"stream": 7, "device": 0, "correlation": 2}},
    {"ph": "X", "cat": "kernel", "name": "volta_sgemm_64x64_nt", "pid": 0, "tid": 7, "ts": 110, "dur": 100,
     "args": {"stream": 7, "device": 0, "correlation": 3}},
    {"ph": "X", "cat": "kernel", "name": "volta_sgemm_64x64_nt", "pid": 0, "tid": 7, "ts": 220, "dur": 100,
     "args": {"stream": 7, "device": 0, "correlation": 4}},
    {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 23, "ts": 0, "dur": 5,
     "args": {"stream": 23, "device": 0, "correlation": 5}},
    {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 23, "ts": 800, "dur": 5,
     "args": {"stream": 23, "device": 0, "correlation": 6}}
  ]})JSON";
  const auto a = analyze(parse_kineto(text));
  ASSERT_EQ(a.idle.size(), 3u);
  const auto* s = busiest_stream(a.idle, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->stream, 7);
  EXPECT_DOUBLE_EQ(s->busy_us, 300.0);
  EXPECT_DOUBLE_EQ(s->idle_us, 20.0);  // two 10 us gaps, not the side stream's 795
  EXPECT_EQ(busiest_stream(a.idle, 1), nullptr);
}

// Fields as other writers give them: a stream id as a decimal string (HTA reads it with int()), and
// ROCm's host-to-device copies, whose name says neither pinned nor pageable: counted in the overall
// rate only, not as pinned.
TEST(TraceFields, AStreamAsAStringAndACopyThatNamesNoHostMemory) {
  const std::string text = R"JSON({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "volta_sgemm_64x64_nt", "pid": 0, "tid": 7, "ts": 0, "dur": 100,
     "args": {"stream": "7", "device": 0, "correlation": 1}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Host -> Device)", "pid": 0, "tid": 7, "ts": 100,
     "dur": 10, "args": {"stream": 7, "device": 0, "bytes": 100000, "correlation": 2}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7, "ts": 120,
     "dur": 10, "args": {"stream": 7, "device": 0, "bytes": 200000, "correlation": 3}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 140,
     "dur": 10, "args": {"stream": 7, "device": 0, "bytes": 50000, "correlation": 4}}
  ]})JSON";
  const auto a = analyze(parse_kineto(text));
  ASSERT_EQ(a.gpu_events, 4);  // the kernel with stream "7" is a GPU event on stream 7
  ASSERT_EQ(a.idle.size(), 1u);
  EXPECT_EQ(a.idle[0].stream, 7);
  EXPECT_EQ(a.copies.htod_count, 3);
  EXPECT_EQ(a.copies.htod_pageable_count, 1);
  EXPECT_DOUBLE_EQ(a.copies.htod_pinned_gbps, 20.0);   // 200,000 B in 10 us, the named pinned copy alone
  EXPECT_DOUBLE_EQ(a.copies.htod_pageable_gbps, 5.0);  // 50,000 B in 10 us
  EXPECT_DOUBLE_EQ(a.copies.htod_gbps, 350000.0 / 30e3);
}

}  // namespace
