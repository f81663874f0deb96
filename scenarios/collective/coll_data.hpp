// Inputs and exact expected outputs of collectives (nccl-tests' idea): every
// input element is a small integer generated from (seed, rank, index), so a
// sum over up to 64 ranks is exact in fp32, fp64 and bf16 alike, and a
// checker on any rank can regenerate what every other rank sent.
#pragma once

#include <cstdint>  // std::int64_t, std::uint64_t
#include <vector>   // std::vector

#include "harness/comm.hpp"  // CollCall

namespace sb {

// An input value in [-4, 3]: |sum| <= 256 on 64 ranks, exact in bf16.
double coll_input_value(std::uint64_t seed, int rank, std::int64_t index);

// The seed of one call in a step loop: the data differ from call to call, so
// a library that pairs a rank's call with another step's call produces wrong
// sums that the check counts.
std::uint64_t call_seed(std::uint64_t base, int step, int call_index);

// Fills `out` (bytes for coll_counts(c, n).send elements of c.dtype) with
// rank's input for call c.
void fill_coll_input(const CollCall& c, int nranks, int rank, std::uint64_t seed, std::vector<unsigned char>& out);

// Counts the elements of rank's received buffer that differ from the exact
// result (0 on a rank that receives nothing: a reduce's non-roots).
std::int64_t count_coll_wrong(const CollCall& c, int nranks, int rank, std::uint64_t seed,
                              const std::vector<unsigned char>& received);

}  // namespace sb
