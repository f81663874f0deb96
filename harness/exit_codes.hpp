// Every exit code stallbench returns, in one place (the CLI's --help lists
// them; scripts and CI read them).
#pragma once

namespace sb {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;     // a point failed (status error), or a write failed
inline constexpr int kExitUsage = 2;       // bad input: one clear message, nothing run
inline constexpr int kExitRegression = 3;  // compare: a gated metric got worse
inline constexpr int kExitHang = 4;        // a hang was caught (watchdog, loader timeout, collective)
inline constexpr int kExitCollectiveError = 5;  // the collective library refused or crashed; dumps written

}  // namespace sb
