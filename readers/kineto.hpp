// A PyTorch profiler trace (Kineto's Chrome trace-event JSON, plain or
// gzip-compressed) read into typed events, streamed: the file is inflated in
// chunks, the traceEvents array is split into its objects by a scanner that
// knows only strings and brackets, and each object is parsed where it lies by
// simdjson's on-demand parser. Memory is the events kept (about 100 bytes
// each) plus one chunk, not the file: python_function events (often most of
// a trace; kept only when ReadOptions asks) and the other categories nothing
// reads are counted, not kept.
//
// What is kept, from each "ph": "X" event:
//   kernel, gpu_memcpy, gpu_memset (pid = device, tid = stream; args: stream,
//     device, correlation, bytes, "memory bandwidth (GB/s)"),
//   cuda_runtime, cuda_driver (args: correlation; cudaLaunchKernel,
//     cudaMemcpyAsync, hipLaunchKernel, ...),
//   cpu_op, user_annotation, gpu_user_annotation (ProfilerStep#N, the
//     DataLoader's __next__), cuda_sync; args "Input type" (record_shapes=True):
//     the element type of the op's first tensor input; args "Sequence number":
//     the autograd node a forward op made, named again by its backward's
//     autograd::engine::evaluate_function;
//   the Kineto of 2021's names for the same: Operator (cpu_op, ProfilerStep#N
//     and the DataLoader's __next__ included), Runtime (cuda_runtime), Kernel,
//     Memcpy, Memset;
//   python_function only when ReadOptions asks (diagnose's host attribution:
//     what the host was doing while the GPU waited); counted otherwise;
// from "ph": "i" events: [memory] (args "Total Allocated", "Device Id");
// from the top level: deviceProperties, distributedInfo (rank, world_size),
// baseTimeNanoseconds.
//
// Times stay in µs as the trace gives them (fractional in newer traces).
// A malformed file throws UsageError (exit 2) naming the byte offset in the
// JSON text (inflated, for a .gz).
#pragma once

#include <cstdint>  // std::int64_t, std::uint32_t
#include <map>      // std::map
#include <optional>  // std::optional
#include <string>   // std::string
#include <string_view>  // std::string_view
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace sb::readers {

enum class Cat : std::uint8_t {
  kernel,
  gpu_memcpy,
  gpu_memset,
  cuda_runtime,
  cuda_driver,
  cpu_op,
  user_annotation,
  gpu_user_annotation,
  cuda_sync,
  python_function,  // kept only with ReadOptions::python_functions
  other,
};
const char* to_string(Cat c);

// The element type of an op's first tensor input, from args "Input type" (record_shapes=True:
// ["float", "float", "Scalar"], "c10::BFloat16", "c10::Half", "long int", ...): what a CPU GEMM
// computes in. none: no tensor input, or a trace without shapes.
enum class ElemType : std::uint8_t { none, f32, f64, bf16, f16, f8, integer, other };
const char* to_string(ElemType t);
ElemType elem_type(std::string_view input_type);  // one element of "Input type"

// The direction and host memory of a copy, from Kineto's name
// ("Memcpy HtoD (Pageable -> Device)") or its args.
enum class CopyKind : std::uint8_t { none, htod, dtoh, dtod, htoh, other };

// An op's inputs as record_shapes=True writes them (args "Input Dims", "Input type", "Concrete Inputs"),
// kept for the ops whose FLOPs can be counted: GEMMs, convolutions, attention (the roofline).
struct OpShape {
  std::vector<std::vector<std::int64_t>> dims;  // per input; [] for a scalar or none
  std::vector<ElemType> types;                   // per input
  std::vector<std::string> concrete;             // per input: a scalar's value as text ("[2, 2]", "1"), or ""
};
// The ops whose shapes the reader keeps.
bool counted_op(std::string_view name);

struct Event {
  double ts = 0, dur = 0;  // µs
  std::int64_t pid = 0, tid = 0;
  std::int64_t correlation = -1;
  std::int64_t stream = -1;  // args.stream (GPU events have it), else -1
  std::int64_t bytes = -1;   // memcpy/memset
  std::int64_t external_id = -1;
  std::int64_t sequence = -1;  // args "Sequence number": a forward op and its backward node share it
  std::uint32_t name = 0;  // index into Trace::names
  Cat cat = Cat::other;
  CopyKind copy = CopyKind::none;
  bool pageable = false;  // a copy from or to pageable host memory ("Pageable" in its name)
  bool pinned = false;    // from or to pinned host memory ("Pinned"; ROCm's "Host -> Device" says neither)
  ElemType input_type = ElemType::none;  // the first tensor input's (args "Input type")
  std::uint32_t shape = 0;  // 1 + its index in Trace::shapes (an op whose FLOPs can be counted), 0: none
  bool is_gpu() const { return cat == Cat::kernel || cat == Cat::gpu_memcpy || cat == Cat::gpu_memset; }
  double end() const { return ts + dur; }
};

struct MemorySample {
  double ts = 0;
  std::int64_t device = -1;  // -1: host
  std::int64_t total_allocated = 0, total_reserved = 0;
  std::int64_t limit = 0;  // "Limit": a stallbench trace's limit in force (0: the device's capacity)
};

struct Trace {
  std::vector<Event> events;  // in file order
  std::vector<std::string> names;
  std::vector<MemorySample> memory;
  std::vector<OpShape> shapes;         // of the cpu ops counted_op() names, where the trace has record_shapes
  nlohmann::ordered_json device_properties = nlohmann::ordered_json::array();
  std::optional<std::int64_t> rank, world_size;
  std::optional<std::int64_t> base_time_ns;
  std::string distributed_backend;
  std::map<std::string, std::int64_t> category_counts;  // every "cat" seen, kept or not ("" = none)
  std::map<std::string, std::int64_t> phase_counts;     // every "ph" seen
  std::int64_t flows = 0;                                // ac2g and other flow events
  std::uint64_t file_bytes = 0;                          // on disk
  std::uint64_t json_bytes = 0;                          // inflated
  bool gzip = false;
  // Some event's ts is written as a float (1712195495505583.0, or with a
  // fraction) or missing: Holistic Trace Analysis then rounds every event's
  // times to whole µs (trace_analysis.hpp).
  bool fractional_ts = false;
  const std::string& name(const Event& e) const { return names[e.name]; }
};

struct ReadOptions {
  // Keep python_function events (with_stack=True traces: often most of the
  // events); off, they are counted in category_counts only.
  bool python_functions = false;
};

// Reads the file at `path` (a regular file: a FIFO or device is refused).
// Throws UsageError (exit 2) with the path and byte offset when it is not a
// Kineto trace.
Trace read_kineto(const std::string& path, const ReadOptions& opt = {});
// The same from JSON text in memory (tests, fuzzing).
Trace parse_kineto(const std::string& text, const ReadOptions& opt = {});

}  // namespace sb::readers
