// train: the training loop end to end, every step-level cause in one loop.
//
// The `batch` scenario's decoder step fed the way a fine-tuning job feeds it:
// a dataset of sequence lengths (the packing scenario's `lengths`), collated
// into micro batches of `micro_batch` rows (padded to the longest of each
// batch, padded to max_len, or packed best-fit-decreasing into max_len rows),
// loaded by a host DataLoader (the dataloader scenario's Loader: `workers`,
// `prefetch`, pinned or pageable staging), copied to the device, and trained
// (`dtype`, `attn`, `grad_accum`, AdamW), with loss.item()'s synchronization
// at each optimizer step. What the user's logs call throughput is measured
// here: real (non-pad) tokens per second.
//
// So every line diagnose recommends (dataloader_num_workers,
// dataloader_pin_memory, sample_packing, bf16, flash_attention,
// micro_batch_size) changes one parameter of this one loop, and its gain is
// measured on the whole loop, not on its part alone.
//
// Definitions (per point, over `trials` timed optimizer steps, more while
// they span under `min_time_s` (at most 2000), after the
// loader's pipeline has started: workers + 1 optimizer steps untimed):
//   wall W: host clock over the timed steps;
//   real tokens R: tokens of the dataset's sequences in the timed batches;
//   computed tokens C: micro_batch x the batch's padded length, summed;
//   the epoch's real share E: real / computed tokens over every batch of
//     the dataset as collated (the plan's arithmetic, exact);
//   real tokens/s = (C / W) x E: the measured rate of computed tokens at the
//     epoch's real share. A few timed batches of lognormal lengths carry
//     their own share (R / C), and R / W swings with it: at micro batch 1 and
//     5 steps, by 30% between runs of one speed. R / W is kept beside it
//     (timed_real_tokens_per_s). The timed steps are the dataset's first
//     batches in every configuration of one collation and micro batch;
//   data wait D: host time blocked in the loader's next() (PyTorch's
//     enumerate(DataLoader)#...__next__ in a profiler trace);
//   device busy B: the device's busy share of W (cpu: the compute thread's
//     clock; cuda: NVML; sim: the modelled stream).
// Each batch's padded length under pad-longest is its longest row rounded up
// to `pad_multiple` (the collator's pad_to_multiple_of), at most max_len; one
// decoder step is built per padded length met, all training one set of
// parameters (DecoderStep's `share`).
//
// The loader's work per row is `load_us_per_token` microseconds of real CPU
// work per real token (tokenizing, collating): an assumption about the
// user's loader, said so in every point, never a measurement of theirs.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "harness/result.hpp"  // Point

namespace sb::train {

// What the timed window recorded; derive() turns it into the point's figures.
struct Record {
  double wall_s = 0;          // W
  double data_wait_s = 0;     // D
  double busy_frac = 0;       // B / W, 0..1
  std::int64_t steps = 0;     // optimizer steps timed
  std::int64_t batches = 0;   // micro batches timed (steps x grad_accum)
  std::int64_t real_tokens = 0, computed_tokens = 0;  // over the timed batches
  // Over every batch of the dataset as collated (the plan's; 0: unknown, the
  // timed batches stand for the epoch).
  std::int64_t epoch_real_tokens = 0, epoch_computed_tokens = 0;
  double load_cpu_s = 0;      // loader CPU time over the timed batches' loads (the loader's own records)
  std::int64_t loads = 0;     // loads those times are over
  int workers = 0, loader_cpus = 0;
  std::vector<double> util;   // the sampler's utilization series over the window
};

// The point's metrics and info (pattern, the queueing model beside the
// measurement). Pure: unit-tested without a device.
Point derive(const Record& r);

}  // namespace sb::train
