#include "harness/result.hpp"

#include <cerrno>    // errno
#include <cstdio>    // std::fopen, std::fwrite, std::fflush, std::rename
#include <cstring>   // std::strerror
#include <iostream>  // std::cout
#include <sstream>   // std::stringstream

#include <fcntl.h>   // open
#include <unistd.h>  // fsync, close, getpid

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError, Error
#include "harness/files.hpp"   // read_regular_file

namespace sb {

const Metric* Point::metric(const std::string& name) const {
  for (const auto& m : metrics)
    if (m.name == name) return &m;
  return nullptr;
}

bool Result::simulated() const { return meta.value("/device/simulated"_json_pointer, false); }

namespace {
using json = nlohmann::ordered_json;

json stats_json(const Stats& s) {
  return json{{"n", s.n},       {"median", s.median}, {"p10", s.p10}, {"p90", s.p90},
              {"mean", s.mean}, {"min", s.min},       {"max", s.max}, {"stdrel", s.stdrel}};
}

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw UsageError(fmt::format("not a stallbench result: {} {}", where, what));
}

const json& need(const json& j, const char* key, json::value_t type, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) bad(where, fmt::format("has no '{}'", key));
  const json& v = j.at(key);
  const bool ok = type == json::value_t::number_float      ? v.is_number()
                  : type == json::value_t::number_unsigned ? v.is_number_integer()
                                                           : v.type() == type;
  if (!ok) bad(where + "." + key, fmt::format("has type {}", v.type_name()));
  return v;
}
}  // namespace

json to_json(const Result& r) {
  json j;
  j["schema_version"] = kResultSchemaVersion;
  j["kind"] = "result";
  j["meta"] = r.meta;
  j["scenario"] = r.scenario;
  j["params"] = r.params;
  json pts = json::array();
  for (const auto& p : r.points) {
    json pj;
    pj["params"] = p.params;
    pj["status"] = to_string(p.status);
    if (!p.reason.empty()) pj["reason"] = p.reason;
    json ms = json::object();
    for (const auto& m : p.metrics) {
      json mj{{"value", m.value}, {"unit", m.unit}, {"direction", to_string(m.direction)}};
      if (m.stats) mj["stats"] = stats_json(*m.stats);
      if (!m.note.empty()) mj["note"] = m.note;
      ms[m.name] = std::move(mj);
    }
    pj["metrics"] = std::move(ms);
    pj["info"] = p.info;
    pts.push_back(std::move(pj));
  }
  j["points"] = std::move(pts);
  json fs = json::array();
  for (const auto& f : r.findings) {
    json fj{{"cause", f.cause}, {"summary", f.summary}};
    if (f.speedup) fj["speedup"] = *f.speedup;
    fj["evidence"] = f.evidence;
    fs.push_back(std::move(fj));
  }
  j["findings"] = std::move(fs);
  if (!r.expected.is_null()) j["expected"] = r.expected;
  return j;
}

Result result_from_json(const json& j) {
  Result r;
  if (!j.is_object()) bad("document", "is not a JSON object");
  if (j.value("kind", "") != "result") bad("document", "has no \"kind\": \"result\"");
  // Read wide, then compared: 4294967297 must not narrow to 1.
  const std::uint64_t version = need(j, "schema_version", json::value_t::number_unsigned, "document").get<std::uint64_t>();
  if (version != std::uint64_t(kResultSchemaVersion))
    bad("document", fmt::format("has schema_version {}, this stallbench reads {}", version, kResultSchemaVersion));
  r.meta = need(j, "meta", json::value_t::object, "document");
  r.scenario = need(j, "scenario", json::value_t::string, "document").get<std::string>();
  r.params = need(j, "params", json::value_t::object, "document");
  const json& pts = need(j, "points", json::value_t::array, "document");
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const std::string w = fmt::format("points[{}]", i);
    const json& pj = pts[i];
    Point p;
    p.params = need(pj, "params", json::value_t::object, w);
    const auto st = parse_status(need(pj, "status", json::value_t::string, w).get<std::string>());
    if (!st) bad(w + ".status", "is not ok|skipped|oom|hang|error");
    p.status = *st;
    p.reason = pj.value("reason", "");
    for (const auto& [name, mj] : need(pj, "metrics", json::value_t::object, w).items()) {
      const std::string mw = w + ".metrics." + name;
      Metric m;
      m.name = name;
      m.value = need(mj, "value", json::value_t::number_float, mw).get<double>();
      m.unit = need(mj, "unit", json::value_t::string, mw).get<std::string>();
      const auto d = parse_direction(need(mj, "direction", json::value_t::string, mw).get<std::string>());
      if (!d) bad(mw + ".direction", "is not higher|lower|none");
      m.direction = *d;
      if (mj.contains("stats")) {
        const json& sj = mj.at("stats");
        Stats s;
        s.n = sj.value("n", 0);
        s.median = sj.value("median", 0.0);
        s.p10 = sj.value("p10", 0.0);
        s.p90 = sj.value("p90", 0.0);
        s.mean = sj.value("mean", 0.0);
        s.min = sj.value("min", 0.0);
        s.max = sj.value("max", 0.0);
        s.stdrel = sj.value("stdrel", 0.0);
        m.stats = s;
      }
      m.note = mj.value("note", "");
      p.metrics.push_back(std::move(m));
    }
    p.info = pj.value("info", json::object());
    r.points.push_back(std::move(p));
  }
  for (const auto& fj : j.value("findings", json::array())) {
    Finding f;
    f.cause = fj.value("cause", "");
    f.summary = fj.value("summary", "");
    if (fj.contains("speedup") && fj["speedup"].is_number()) f.speedup = fj["speedup"].get<double>();
    f.evidence = fj.value("evidence", json::object());
    r.findings.push_back(std::move(f));
  }
  if (j.contains("expected")) r.expected = j["expected"];
  return r;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text << std::flush;
    // stdout closed or full (`--json - >&-`): the result is lost, and that is
    // a failure, never exit 0.
    if (!std::cout) {
      std::cout.clear();
      throw Error(ErrorKind::runtime, "cannot write the result to stdout (closed, or the disk is full)");
    }
    return;
  }
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  auto fail = [&](const char* what) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(ErrorKind::runtime, fmt::format("cannot write {}: {} failed: {}", path, what, std::strerror(e)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open");
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("write");
    }
    done += std::size_t(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

json read_json_file(const std::string& path) {
  const std::string text = read_regular_file(path, "JSON file");
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
}

}  // namespace sb
