// The input and output of `stallbench analyze-hang`: reading flight-recorder
// dumps (one file, or a directory holding several runs) and printing the
// report as text or JSON. The analysis itself is in hang_analysis.cpp.
#include "diagnose/hang/hang_analysis.hpp"

#include <algorithm>     // std::sort, std::max
#include <atomic>        // std::atomic: the next file to read
#include <optional>      // std::optional
#include <thread>        // std::thread: files read in parallel
#include <filesystem>    // std::filesystem: the dump directory
#include <map>           // std::map: run id -> dumps
#include <system_error>  // std::error_code, std::system_error (a thread that cannot be made)

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"  // UsageError
#include "harness/json_read.hpp"  // JsonRef, reading_file, without_file_prefix
#include "harness/files.hpp"      // read_regular_file
#include "readers/pickle.hpp"  // looks_like_pickle
#include "harness/result.hpp"     // read_json_file
#include "diagnose/hang/torch_fr_analysis.hpp"  // PyTorch's dumps

namespace sb {

namespace {

using json = nlohmann::ordered_json;

// More ranks than any job has run (the largest known are ~100k GPUs): a
// larger size in a dump is damage, not a job.
constexpr std::int64_t kMaxDumpRanks = 1 << 20;

bool is_dump(const json& j) {
  if (!j.is_object()) return false;
  auto it = j.find("format");
  return it != j.end() && it->is_string() && it->get<std::string>() == kFlightRecorderFormat;
}

std::string int_list(const std::vector<int>& v) { return v.empty() ? "none" : fmt::format("{}", fmt::join(v, ", ")); }

std::string seq_text(std::int64_t s) { return s == -2 ? "?" : s == -1 ? "-" : std::to_string(s); }

}  // namespace

RankDump rank_dump_from_json(const json& doc, const std::string& file) {
  return reading_file(file, [&] {
    const JsonRef j(doc, file);
    j.object();
    const JsonRef format = j.at("format");
    if (format.str() != kFlightRecorderFormat)
      format.fail(fmt::format("expected \"{}\", got {}: not a flight-recorder dump", kFlightRecorderFormat,
                              format.describe()));
    const JsonRef version = j.at("version");
    if (const std::int64_t v = version.integer(); v != kFlightRecorderVersion)
      version.fail(fmt::format("expected {}, got version {}: not supported (this build reads {})",
                               kFlightRecorderVersion, v, kFlightRecorderVersion));

    RankDump d;
    DumpHeader& h = d.header;
    h.run_id = j.at("run_id").str();
    // Ranges first: a size read from a file bounds loops and tables, and
    // 4294967297 must not narrow to rank 1.
    h.size = j.at("size").int32(1, kMaxDumpRanks);
    h.rank = j.at("rank").int32(0, h.size - 1);
    h.local_rank = j.at("local_rank").int32(0, h.size - 1);
    h.host = j.at("host").str();
    h.pid = static_cast<long>(j.at("pid").integer());
    h.backend = j.at("backend").str();
    h.device = j.at("device").str();
    h.timeout_s = j.at("timeout_s").number();
    d.reason = j.at("reason").str();
    d.where = j.at("where").str();
    d.time_us = j.at("time_us").integer(0, kMaxDumpTimeUs);
    d.dropped = j.at("dropped").integer(0, kMaxDumpSeq);
    d.last_enqueued_seq = j.at("last_enqueued_seq").integer(-1, kMaxDumpSeq);
    d.last_completed_seq = j.at("last_completed_seq").integer(-1, kMaxDumpSeq);
    const JsonRef es = j.at("entries").array();
    d.entries.reserve(es.size());
    for (std::size_t i = 0; i < es.size(); ++i) d.entries.push_back(flight_entry_from_json(es.at(i)));
    std::stable_sort(d.entries.begin(), d.entries.end(),
                     [](const FlightEntry& a, const FlightEntry& b) { return a.seq < b.seq; });
    // The counters must agree with the entries present, as a ring's dump
    // always does: seqs dropped..last_enqueued_seq, each once. The analysis
    // walks sequence numbers, and its work must be bounded by the data in the
    // file (a rank with no entries but a last seq of 9e18 once meant a walk
    // over 9e18 seqs).
    for (std::size_t i = 1; i < d.entries.size(); ++i)
      if (d.entries[i].seq != d.entries[i - 1].seq + 1)
        es.fail(fmt::format("seqs {} and {} {}: a ring's entries are consecutive", d.entries[i - 1].seq,
                            d.entries[i].seq, d.entries[i].seq == d.entries[i - 1].seq ? "repeat" : "leave a gap"));
    const std::int64_t oldest = d.entries.empty() ? d.dropped : d.entries.front().seq;
    const std::int64_t newest = d.entries.empty() ? d.dropped - 1 : d.entries.back().seq;
    if (oldest != d.dropped)
      j.at("dropped").fail(fmt::format("is {}, but the oldest entry is seq {}: the ring drops seqs 0..oldest-1",
                                       d.dropped, oldest));
    if (d.last_enqueued_seq != newest)
      j.at("last_enqueued_seq")
          .fail(fmt::format("last_enqueued_seq {} does not match its entries (newest seq {}, {} dropped)",
                            d.last_enqueued_seq, newest, d.dropped));
    if (d.entries.empty() && d.dropped != 0)
      j.at("dropped").fail(fmt::format("is {} with no entries: a ring that issued a call keeps the last one",
                                       d.dropped));
    if (d.last_completed_seq > d.last_enqueued_seq)
      j.at("last_completed_seq")
          .fail(fmt::format("last_completed_seq {} is outside -1..last_enqueued_seq {}", d.last_completed_seq,
                            d.last_enqueued_seq));
    return d;
  });
}

HangReport analyze_hang_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw UsageError(fmt::format("analyze-hang: {} does not exist", dir));
  if (!fs::is_directory(dir, ec)) throw UsageError(fmt::format("analyze-hang: {} is not a directory", dir));
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  if (ec) throw UsageError(fmt::format("analyze-hang: cannot list {}: {}", dir, ec.message()));
  std::sort(files.begin(), files.end());

  // PyTorch's dumps (a pickle, or JSON with version and entries) go to the
  // PyTorch analysis; ours (*.json with our format tag) to ours. Files are
  // read and parsed on every CPU at once: a 16-rank job's dumps are tens of
  // MB of pickle.
  struct Slot {
    std::optional<TorchFrDump> torch;
    bool ours = false;
    std::string warning;
    bool out_of_memory = false;  // set where formatting a message could itself fail
  };
  std::vector<Slot> slots(files.size());
  auto read_one = [&](std::size_t i) {
    const std::string& f = files[i];
    const bool is_json = fs::path(f).extension() == ".json";
    try {
      std::string bytes = read_regular_file(f, "flight-recorder dump");
      if (looks_like_pickle(bytes)) {
        slots[i].torch = read_torch_fr_file(f, std::move(bytes));
        return;
      }
      if (!is_json && (bytes.empty() || bytes.front() != '{')) return;  // a note or a log beside the dumps
      json j;
      try {
        j = parse_json_text(bytes, f);
      } catch (const UsageError&) {
        if (is_json) slots[i].ours = true;  // ours are re-read below and warned about there
        else throw;
        return;
      }
      if (is_torch_fr_json(j)) {
        // A PyTorch dump that does not read is warned about as one (not
        // handed to our reader, which would only say it is not ours).
        const int rank = rank_from_file_name(f);
        if (rank < 0) throw UsageError(fmt::format("{}: no rank number at the end of the file name", f));
        slots[i].torch = torch_fr_from_json(std::move(j), f, rank);
      } else if (is_json) {
        slots[i].ours = true;
      }
    } catch (const UsageError& e) {
      try {
        slots[i].warning = fmt::format("skipped {}: {}", f, without_file_prefix(e.what(), f));
      } catch (...) {
        slots[i].out_of_memory = true;
      }
    } catch (...) {  // std::bad_alloc, std::length_error: nothing may leave a worker thread
      slots[i].out_of_memory = true;
    }
  };
  {
    std::atomic<std::size_t> next{0};
    const std::size_t n = std::min<std::size_t>(files.size(), std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    try {
      for (std::size_t t = 1; t < n; ++t)
        pool.emplace_back([&] {
          for (std::size_t i; (i = next++) < files.size();) read_one(i);
        });
    } catch (const std::system_error&) {
      // No more threads to be had (a pid limit): this thread reads the rest.
    }
    for (std::size_t i; (i = next++) < files.size();) read_one(i);
    for (auto& t : pool) t.join();
  }
  std::vector<std::string> ours;
  std::vector<TorchFrDump> torch;
  std::vector<std::string> torch_warnings;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (slots[i].torch) torch.push_back(std::move(*slots[i].torch));
    if (slots[i].ours) ours.push_back(files[i]);
    if (!slots[i].warning.empty()) torch_warnings.push_back(std::move(slots[i].warning));
    if (slots[i].out_of_memory) torch_warnings.push_back(fmt::format("skipped {}: out of memory reading it", files[i]));
  }
  if (!torch.empty()) {
    HangReport r = analyze_torch_fr(torch);
    r.dir = dir;
    r.warnings.insert(r.warnings.begin(), torch_warnings.begin(), torch_warnings.end());
    for (const auto& f : ours) r.warnings.push_back(fmt::format("skipped {}: not a PyTorch Flight Recorder dump", f));
    return r;
  }
  if (ours.empty() && !torch_warnings.empty())
    throw UsageError(fmt::format("analyze-hang: no readable flight-recorder dump in {} ({})", dir,
                                 fmt::join(torch_warnings, "; ")));
  return analyze_hang_files(dir, ours, read_json_file);
}

HangReport analyze_hang_files(const std::string& dir, const std::vector<std::string>& files,
                              const std::function<nlohmann::ordered_json(const std::string&)>& read) {
  // A bad file is a warning, not the end: the other ranks' dumps still say a
  // lot, and the report names the rank whose dump is missing.
  std::vector<std::string> warnings;
  std::map<std::string, std::vector<RankDump>> runs;
  for (const auto& f : files) {
    try {
      const json j = read(f);
      if (!is_dump(j)) {
        warnings.push_back(fmt::format("skipped {}: not a flight-recorder dump", f));
        continue;
      }
      RankDump d = rank_dump_from_json(j, f);
      d.path = f;
      runs[d.header.run_id].push_back(std::move(d));
    } catch (const UsageError& e) {
      warnings.push_back(fmt::format("skipped {}: {}", f, without_file_prefix(e.what(), f)));
    }
  }
  if (runs.empty())
    throw UsageError(fmt::format("analyze-hang: no flight-recorder dump in {}{}", dir,
                                 warnings.empty() ? "" : " (" + fmt::format("{}", fmt::join(warnings, "; ")) + ")"));

  // The newest run is the one being asked about; older ones are leftovers.
  auto newest = [](const std::vector<RankDump>& ds) {
    std::int64_t t = 0;
    for (const auto& d : ds) t = std::max(t, d.time_us);
    return t;
  };
  auto chosen = runs.begin();
  for (auto it = runs.begin(); it != runs.end(); ++it)
    if (newest(it->second) > newest(chosen->second)) chosen = it;
  for (const auto& [run, ds] : runs) {
    if (run == chosen->first) continue;
    std::vector<std::string> paths;
    for (const auto& d : ds) paths.push_back(d.path);
    warnings.push_back(fmt::format("stale dumps of run {} ignored: {}", run, fmt::format("{}", fmt::join(paths, ", "))));
  }

  HangReport r = analyze_dumps(chosen->second);
  r.dir = dir;
  r.warnings.insert(r.warnings.begin(), warnings.begin(), warnings.end());
  return r;
}

std::string format_hang_report(const HangReport& r) {
  auto ranks = [&](const std::vector<int>& v) {
    return r.format == kFlightRecorderFormat ? int_list(v) : rank_ranges(v);
  };
  std::string out = fmt::format("analyze-hang {}: {}{}, size {}: dumps from {} of {} ranks ({}){}\n",
                                r.dir.empty() ? "(dumps)" : r.dir,
                                r.format == kFlightRecorderFormat ? "run " + r.run_id : "PyTorch Flight Recorder",
                                r.process_group.empty() ? "" : ", process group " + r.process_group, r.size,
                                r.ranks_found.size(), r.size, ranks(r.ranks_found),
                                r.ranks_missing.empty() ? "" : fmt::format(", none from {}", ranks(r.ranks_missing)));
  if (r.kind == DivergenceKind::none && !r.ranks_missing.empty()) {
    out += fmt::format("verdict: incomplete: no dump from rank{} {}; no divergence among the dumps there are\n",
                       r.ranks_missing.size() == 1 ? "" : "s", ranks(r.ranks_missing));
  } else if (r.kind == DivergenceKind::none) {
    out += "verdict: no divergence\n";
  } else {
    out += fmt::format("verdict: {}{} at seq {}", to_string(r.kind),
                       r.pattern.empty() ? "" : " (" + r.pattern + ")", r.seq);
    if (r.step >= 0) out += fmt::format(", step {} call {}", r.step, r.call_index);
    if (!r.confidence.empty())  // no dump from them: suspects, by the others' waits
      out += fmt::format("; suspect{} {} ({} confidence: no dump from {})\n", r.culprits.size() == 1 ? "" : "s",
                         int_list(r.culprits), r.confidence, r.culprits.size() == 1 ? "it" : "them");
    else
      out += fmt::format("; culprit{} {}\n", r.culprits.size() == 1 ? "" : "s", int_list(r.culprits));
    if (!r.expected.empty()) out += fmt::format("expected: {}\n", r.expected);
  }
  if (!r.torch_match_state.empty()) {
    if (r.format != kFlightRecorderFormat && !r.ranks_missing.empty())  // fr_trace refuses an incomplete set
      out += fmt::format("PyTorch's fr_trace would say: Missing dump files from ranks {{{}}} (it stops there); with "
                         "--allow-incomplete-ranks: {}\n",
                         fmt::join(r.ranks_missing, ", "), r.torch_match_state);
    else
      out += fmt::format("PyTorch's fr_trace would say: {}\n", r.torch_match_state);
  }
  if (r.format != kFlightRecorderFormat)
    out += fmt::format("last collective every rank{} completed: {}\n", r.ranks_missing.empty() ? "" : " with a dump",
                       r.last_all_completed_seq >= 0
                           ? fmt::format("seq {} ({})", r.last_all_completed_seq, r.last_all_completed)
                           : std::string("none in the dumps"));
  out += fmt::format("summary: {}\n", r.summary);
  if (!r.evidence.empty()) {
    out += "evidence:\n";
    for (const auto& e : r.evidence) out += "  - " + e + "\n";
  }
  if (!r.decides.empty()) {
    out += "what decides it:\n";
    for (const auto& d : r.decides) out += "  - " + d + "\n";
  }
  if (!r.wait_cycle.empty()) {
    out += "wait cycle:";
    for (const auto& w : r.wait_cycle) out += fmt::format(" rank {} in {} ->", w.rank, w.where);
    out += fmt::format(" rank {}\n", r.wait_cycle.front().rank);
  }
  if (!r.culprit_frames.empty()) {
    out += "culprit's Python stack at that collective:\n";
    for (const auto& f : r.culprit_frames) out += "  " + f + "\n";
  }

  // The per-rank table: "?" marks a rank without a dump, "-" no seq at all.
  // The call column exists only when there is a divergent seq to show.
  const bool calls = r.seq >= 0;
  const std::string call_head = calls ? fmt::format("call at seq {}", r.seq) : "";
  std::size_t call_w = call_head.size();
  for (const auto& c : r.per_rank_call) call_w = std::max(call_w, c.size());
  auto row = [&](const std::string& rank, const std::string& done, const std::string& issued,
                 const std::string& call, const std::string& where) {
    return calls ? fmt::format("{:>5}  {:>14}  {:>14}  {:<{}}  {}\n", rank, done, issued, call, call_w, where)
                 : fmt::format("{:>5}  {:>14}  {:>14}  {}\n", rank, done, issued, where);
  };
  out += row("rank", "last completed", "last enqueued", call_head, "where");
  // PyTorch's dumps: a row per dump (a job of thousands of ranks may come
  // with a few of them; the rest are named as ranges above).
  const bool every_rank = r.format == kFlightRecorderFormat;
  // A rank's own count can include the divergent call: PyTorch retires a call that failed (timed
  // out) and counts it in pg_status' last_completed_collective, though a rank never joined it.
  bool counted_failed = false;
  for (int k = 0; k < r.size; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const bool has = i < r.last_enqueued.size() && r.last_enqueued[i] != -2;
    if (!every_rank && !has) continue;
    const std::string call = i < r.per_rank_call.size() ? r.per_rank_call[i] : "-";
    if (has) {
      const bool mark = r.kind == DivergenceKind::missing && r.seq >= 0 && r.last_completed[i] >= r.seq;
      counted_failed = counted_failed || mark;
      out += row(std::to_string(k), seq_text(r.last_completed[i]) + (mark ? " *" : ""), seq_text(r.last_enqueued[i]),
                 call, "\"" + r.where[i] + "\"");
    } else {
      out += row(std::to_string(k), "?", "?", "?", "(no dump)");
    }
  }
  if (counted_failed)
    out += fmt::format("  * the rank's own count includes seq {}, which not every rank joined: a call that failed "
                       "(timed out) is retired and counted as completed there\n",
                       r.seq);
  if (!r.wrong_data_from.empty()) {
    std::vector<std::string> w;
    for (const auto& [rank, seq] : r.wrong_data_from) w.push_back(fmt::format("rank {} from seq {}", rank, seq));
    out += fmt::format("wrong data: {} (the library paired mismatched calls silently)\n", fmt::format("{}", fmt::join(w, ", ")));
  }
  // Below a millisecond the "slowest" rank is clock resolution, not a straggler.
  if (r.stall_seq >= 0 && r.stall_lost_ms > 1.0)
    out += fmt::format("slowest arrival: rank {} at seq {}; the others waited up to {:.1f} ms\n", r.stall_rank,
                       r.stall_seq, r.stall_lost_ms);
  if (!r.warnings.empty()) {
    out += "warnings:\n";
    for (const auto& w : r.warnings) out += "  " + w + "\n";
  }
  return out;
}

json to_json(const HangReport& r) {
  json j;
  j["dir"] = r.dir;
  j["run_id"] = r.run_id;
  j["size"] = r.size;
  j["ranks_found"] = r.ranks_found;
  j["ranks_missing"] = r.ranks_missing;
  j["kind"] = to_string(r.kind);
  j["pattern"] = r.pattern;
  j["seq"] = r.seq;
  j["step"] = r.step;
  j["call"] = r.call_index;
  j["culprits"] = r.culprits;
  j["expected"] = r.expected;
  j["per_rank_call"] = r.per_rank_call;
  json ranks = json::array();
  for (int k = 0; k < r.size; ++k) {
    const auto i = static_cast<std::size_t>(k);
    if (r.format != kFlightRecorderFormat && (i >= r.last_enqueued.size() || r.last_enqueued[i] == -2)) continue;
    json rk;
    rk["rank"] = k;
    rk["last_completed_seq"] = i < r.last_completed.size() ? r.last_completed[i] : -2;
    rk["last_enqueued_seq"] = i < r.last_enqueued.size() ? r.last_enqueued[i] : -2;
    rk["where"] = i < r.where.size() ? r.where[i] : "";
    rk["call_at_seq"] = i < r.per_rank_call.size() ? r.per_rank_call[i] : "-";
    ranks.push_back(std::move(rk));
  }
  j["ranks"] = std::move(ranks);
  json wrong = json::array();
  for (const auto& [rank, seq] : r.wrong_data_from) wrong.push_back({{"rank", rank}, {"seq", seq}});
  j["wrong_data_from"] = std::move(wrong);
  j["stall"] = {{"seq", r.stall_seq}, {"rank", r.stall_rank}, {"lost_ms", r.stall_lost_ms}};
  j["summary"] = r.summary;
  j["warnings"] = r.warnings;
  j["format"] = r.format;
  if (r.format != kFlightRecorderFormat) {
    j["process_group"] = r.process_group;
    j["torch_match_state"] = r.torch_match_state;
    j["last_all_completed"] = {{"seq", r.last_all_completed_seq}, {"collective", r.last_all_completed}};
    j["culprit_frames"] = r.culprit_frames;
    json cycle = json::array();
    for (const auto& w : r.wait_cycle)
      cycle.push_back({{"rank", w.rank},
                       {"process_group", w.process_group},
                       {"kind", w.p2p ? "p2p" : "collective"},
                       {"seq", w.seq},
                       {"call", w.call},
                       {"waits_for", w.waits_for}});
    j["wait_cycle"] = std::move(cycle);
    if (!r.confidence.empty())
      j["suspect"] = {{"ranks", r.culprits},
                      {"confidence", r.confidence},
                      {"evidence", r.evidence},
                      {"decides", r.decides}};
  }
  return j;
}

}  // namespace sb
