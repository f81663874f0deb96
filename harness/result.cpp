#include "harness/result.hpp"

#include <cerrno>    // errno
#include <cstdio>    // std::fopen, std::fwrite, std::fflush, std::rename
#include <cstring>   // std::strerror
#include <iostream>  // std::cout
#include <sstream>   // std::stringstream

#include <fcntl.h>   // open
#include <sys/stat.h>  // stat, fchmod: a replaced file keeps its mode
#include <unistd.h>  // fsync, close, getpid

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/device.hpp"  // kDeviceKindNames, parse_device_kind
#include "harness/errors.hpp"  // UsageError, Error
#include "harness/files.hpp"   // read_regular_file
#include "harness/json_read.hpp"  // JsonRef, parse_json_text, reading_file

namespace sb {

const Metric* Point::metric(const std::string& name) const {
  for (const auto& m : metrics)
    if (m.name == name) return &m;
  return nullptr;
}

bool Result::simulated() const {
  const auto ptr = "/device/simulated"_json_pointer;
  return meta.contains(ptr) && meta.at(ptr).is_boolean() && meta.at(ptr).get<bool>();
}

namespace {
using json = nlohmann::ordered_json;

json stats_json(const Stats& s) {
  return json{{"n", s.n},       {"median", s.median}, {"p10", s.p10}, {"p90", s.p90},
              {"mean", s.mean}, {"min", s.min},       {"max", s.max}, {"stdrel", s.stdrel}};
}

// Summary statistics: n, median, p10 and p90 always; the rest when written.
Stats stats_from_json(const JsonRef& sj) {
  sj.object();
  Stats s;
  s.n = sj.at("n").int32(0);
  s.median = sj.at("median").number();
  s.p10 = sj.at("p10").number();
  s.p90 = sj.at("p90").number();
  const std::pair<const char*, double*> optional[] = {{"mean", &s.mean}, {"min", &s.min}, {"max", &s.max},
                                                      {"stdrel", &s.stdrel}};
  for (const auto& [key, field] : optional)
    if (const auto v = sj.find(key)) *field = v->number();
  return s;
}

std::string optional_str(const JsonRef& j, const char* key) {
  const auto v = j.find(key);
  return v ? v->str() : std::string();
}

// The parts of meta that readers of a result use (compare's labels and its
// point matching): the device (its kind or id names what compare matches expected numbers
// for), the rest typed when present.
void check_meta(const JsonRef& meta) {
  meta.object();
  {
    const JsonRef dev = meta.at("device");
    dev.object();
    if (!dev.find("kind") && !dev.find("id"))
      dev.fail("expected a device with a kind (cpu|cuda|sim) or an id, got neither");
    for (const char* key : {"id", "name"})
      if (const auto v = dev.find(key)) v->str();
    // The kind as run_meta writes it (cpu, cuda, sim), or, without it, the id's prefix
    // (cuda:0, sim:h100): compare matches expected numbers by it.
    if (const auto v = dev.find("kind")) v->choice(kDeviceKindNames);
    else if (const auto id = dev.find("id")) {
      const std::string s = id->str();
      if (!parse_device_kind(s.substr(0, s.find(':'))))
        id->fail(fmt::format("expected an id that starts with {} (as cpu, cuda:0, sim:h100), got {}",
                             fmt::join(kDeviceKindNames.names(), "|"), id->describe()));
    }
    if (const auto v = dev.find("simulated")) v->boolean();
  }
  if (const auto mp = meta.find("measurement_params")) {
    mp->array();
    for (std::size_t i = 0; i < mp->size(); ++i) mp->at(i).str();
  }
}
}  // namespace

json workload_params(const Result& r, const json& params) {
  json out = params;
  for (const auto& k : r.meta.value("measurement_params", json::array()))
    if (k.is_string()) out.erase(k.get<std::string>());
  return out;
}

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

Result result_from_json(const json& doc, const std::string& file) {
  return reading_file(file, [&] {
    const JsonRef j(doc, file);
    if (!doc.is_object() || !doc.contains("kind"))
      throw UsageError(fmt::format("{} is not a stallbench result (it has no \"kind\": \"result\")", file));
    const JsonRef kind = j.at("kind");
    if (kind.str() != "result")
      kind.fail(fmt::format("expected \"result\", got {}: not a stallbench result", kind.describe()));
    const JsonRef version = j.at("schema_version");
    if (const std::int64_t v = version.integer(); v != kResultSchemaVersion)
      version.fail(fmt::format("expected {}, got schema_version {}: this stallbench reads version {}",
                               kResultSchemaVersion, v, kResultSchemaVersion));
    Result r;
    check_meta(j.at("meta"));
    r.meta = j.at("meta").raw();
    r.scenario = j.at("scenario").str();
    r.params = j.at("params").object().raw();
    const JsonRef pts = j.at("points").array();
    r.points.reserve(pts.size());
    for (std::size_t i = 0; i < pts.size(); ++i) {
      const JsonRef pj = pts.at(i).object();
      Point p;
      p.params = pj.at("params").object().raw();
      p.status = pj.at("status").choice(kStatusNames);
      p.reason = optional_str(pj, "reason");
      for (const auto& [name, mj] : pj.at("metrics").members()) {
        mj.object();
        Metric m;
        m.name = name;
        m.value = mj.at("value").number();
        m.unit = mj.at("unit").str();
        m.direction = mj.at("direction").choice(kDirectionNames);
        if (const auto sj = mj.find("stats")) m.stats = stats_from_json(*sj);
        m.note = optional_str(mj, "note");
        p.metrics.push_back(std::move(m));
      }
      if (const auto info = pj.find("info")) p.info = info->object().raw();
      r.points.push_back(std::move(p));
    }
    if (const auto fs = j.find("findings")) {
      fs->array();
      for (std::size_t i = 0; i < fs->size(); ++i) {
        const JsonRef fj = fs->at(i).object();
        Finding f;
        f.cause = fj.at("cause").str();
        f.summary = fj.at("summary").str();
        if (const auto v = fj.find("speedup")) f.speedup = v->number();
        if (const auto v = fj.find("evidence")) f.evidence = v->object().raw();
        r.findings.push_back(std::move(f));
      }
    }
    if (const auto e = j.find("expected")) {
      e->object();
      optional_str(*e, "id");
      optional_str(*e, "path");
      r.expected = e->raw();
    }
    return r;
  });
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
  // A file replaced keeps its permission bits (a 0600 result stays 0600).
  struct stat old {};
  if (::stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode) && ::fchmod(fd, old.st_mode & 07777) != 0) {
    ::close(fd);
    fail("fchmod");
  }
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
  return parse_json_text(read_regular_file(path, "JSON file"), path);
}

}  // namespace sb
