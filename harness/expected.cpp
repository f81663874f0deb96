#include "harness/expected.hpp"

#include <algorithm>   // std::sort, std::find
#include <filesystem>  // std::filesystem
#include <iostream>    // std::cerr: a skipped file's warning
#include <mutex>       // std::mutex
#include <set>         // std::set: warnings already given
#include <system_error>  // std::error_code

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"     // UsageError
#include "harness/json_read.hpp"  // JsonRef, reading_file, without_file_prefix
#include "harness/result.hpp"     // read_json_file

#ifndef STALLBENCH_SOURCE_DIR
#define STALLBENCH_SOURCE_DIR ""
#endif
#ifndef STALLBENCH_INSTALL_DATADIR
#define STALLBENCH_INSTALL_DATADIR ""
#endif

namespace fs = std::filesystem;

namespace sb {

using json = nlohmann::ordered_json;

std::string ExpectedFile::id() const { return doc.value("/hardware/id"_json_pointer, std::string("?")); }

std::optional<std::pair<double, std::string>> ExpectedFile::peak_tflops(DType t) const {
  const auto ptr = json::json_pointer("/peaks/tflops/" + std::string(to_string(t)));
  if (!doc.contains(ptr)) return std::nullopt;
  const json& p = doc.at(ptr);
  if (!p.contains("value") || !p["value"].is_number()) return std::nullopt;
  return std::make_pair(p["value"].get<double>(),
                        fmt::format("{} ({})", p.value("source", "?"), p.value("kind", "?")));
}

bool where_matches(const json& where, const json& params) {
  if (!where.is_object()) return true;
  for (const auto& [k, v] : where.items()) {
    if (!params.contains(k)) return false;
    const json& p = params.at(k);
    // {"min": a, "max": b}: a range, either end optional ("bytes": {"min": 1073741824} for a figure
    // nccl-tests publishes for bus-saturating messages only).
    if (v.is_object()) {
      if (!p.is_number()) return false;
      const double x = p.get<double>();
      if (v.contains("min") && !(x >= v["min"].get<double>())) return false;
      if (v.contains("max") && !(x <= v["max"].get<double>())) return false;
      continue;
    }
    if (p != v) return false;
  }
  return true;
}

std::vector<json> ExpectedFile::figures_for(const std::string& scenario, const std::string& metric,
                                            const json& params) const {
  // Only the most specific matches count: a figure for {dtype, size} says
  // more about a size-8192 point than a figure for {dtype} over all shapes.
  std::vector<json> out;
  std::size_t best = 0;
  for (const auto& f : doc.value("figures", json::array())) {
    const json where = f.value("where", json::object());
    if (f.value("scenario", "") != scenario || f.value("metric", "") != metric || !where_matches(where, params))
      continue;
    if (where.size() > best) {
      out.clear();
      best = where.size();
    }
    if (where.size() == best) out.push_back(f);
  }
  return out;
}

namespace {

void check_strings(const JsonRef& arr) {
  arr.array();
  for (std::size_t i = 0; i < arr.size(); ++i) arr.at(i).str();
}

void check_optional_str(const JsonRef& j, const char* key) {
  if (const auto v = j.find(key)) v->str();
}

// A datasheet peak or a figure: a value > 0 with its unit, kind and source.
void check_figure_fields(const JsonRef& f) {
  f.at("value").positive();
  f.at("unit").str();
  f.at("kind").one_of({"datasheet", "published", "measured"});
  f.at("source").str();
  check_optional_str(f, "note");
}

// Every field that a reader of the file uses (match_expected, compare, the
// sim device's model), typed, as results/schema/expected.schema.json has them.
void check_expected_doc(const JsonRef& doc) {
  doc.object();
  const JsonRef hw = doc.at("hardware").object();
  hw.at("id").str();
  hw.at("class").one_of({"gpu", "cpu"});
  check_optional_str(hw, "name");
  if (const auto match = hw.find("match")) {
    match->object();
    for (const char* key : {"name_contains", "isa", "isa_absent"})
      if (const auto v = match->find(key)) check_strings(*v);
    if (const auto v = match->find("logical_cores")) v->int32(1);
    if (const auto v = match->find("vendor")) v->str();
    if (const auto v = match->find("family")) v->int32(0);
  }
  if (const auto peaks = doc.find("peaks")) {
    peaks->object();
    if (const auto tflops = peaks->find("tflops"))
      for (const auto& [dtype, peak] : tflops->members()) check_figure_fields(peak.object());
    for (const char* key : {"memory_bandwidth", "memory_capacity"})
      if (const auto v = peaks->find(key)) check_figure_fields(v->object());
  }
  if (const auto figs = doc.find("figures")) {
    figs->array();
    for (std::size_t i = 0; i < figs->size(); ++i) {
      const JsonRef f = figs->at(i).object();
      f.at("scenario").str();
      f.at("metric").str();
      if (const auto w = f.find("where")) {
        w->object();
        for (const auto& [key, value] : w->members()) {
          if (!value.raw().is_object()) continue;  // a value to equal
          for (const auto& [end, bound] : value.members()) {
            if (end != "min" && end != "max")
              bound.fail(fmt::format("a range has only min and max, not \"{}\"", end));
            bound.number();
          }
        }
      }
      f.at("direction").one_of({"higher", "lower"});
      check_figure_fields(f);
    }
  }
}

}  // namespace

ExpectedFile expected_from_json(nlohmann::ordered_json doc, const std::string& file) {
  reading_file(file, [&] {
    const JsonRef j(doc, file);
    if (!doc.is_object() || !doc.contains("kind"))
      throw UsageError(fmt::format("{} is not an expected-numbers file (it has no \"kind\": \"expected\")", file));
    const JsonRef kind = j.at("kind");
    if (kind.str() != "expected")
      kind.fail(fmt::format("expected \"expected\", got {}: not an expected-numbers file", kind.describe()));
    const JsonRef version = j.at("schema_version");
    if (const std::int64_t v = version.integer(); v != 1)
      version.fail(fmt::format("expected 1, got schema_version {}: this stallbench reads version 1", v));
    check_expected_doc(j);
  });
  return ExpectedFile{file, std::move(doc)};
}

std::vector<std::string> expected_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("STALLBENCH_DATA_DIR"); env && *env)
    dirs.push_back((fs::path(env) / "expected").string());
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path().parent_path() / "share" / "stallbench" / "expected").string());
  if (*STALLBENCH_INSTALL_DATADIR) dirs.push_back((fs::path(STALLBENCH_INSTALL_DATADIR) / "expected").string());
  if (*STALLBENCH_SOURCE_DIR) dirs.push_back((fs::path(STALLBENCH_SOURCE_DIR) / "results" / "expected").string());
  return dirs;
}

ExpectedFile load_expected_file(const std::string& path) { return expected_from_json(read_json_file(path), path); }

std::vector<std::string> expected_paths_in(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return paths;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".json") paths.push_back(it->path().string());
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<ExpectedFile> load_expected_dir(const std::string& dir, std::vector<std::string>& skipped) {
  std::vector<ExpectedFile> files;
  for (const auto& p : expected_paths_in(dir)) {
    try {
      files.push_back(load_expected_file(p));
    } catch (const UsageError& e) {
      skipped.push_back(fmt::format("skipped expected-numbers file {}: {}", p, without_file_prefix(e.what(), p)));
    }
  }
  return files;
}

std::vector<ExpectedFile> load_expected_files() {
  for (const auto& d : expected_dirs()) {
    if (expected_paths_in(d).empty()) continue;
    std::vector<std::string> skipped;
    std::vector<ExpectedFile> files = load_expected_dir(d, skipped);
    // The files are read more than once in a run (the device, then its
    // expected numbers): each bad one is reported once.
    static std::mutex mu;
    static std::set<std::string> reported;
    std::lock_guard lock(mu);
    for (const auto& s : skipped)
      if (reported.insert(s).second) std::cerr << "stallbench: warning: " << s << "\n";
    return files;
  }
  return {};
}

std::string expected_mismatch(const ExpectedFile& f, const DeviceInfo& dev, const CpuInfo& cpu) {
  // Read from a checked file (expected_from_json): every field here is typed.
  const json& hw = f.doc.at("hardware");
  const json match = hw.value("match", json::object());
  const std::string cls = hw.value("class", "gpu");
  const auto has_isa = [&](const json& isa) {
    return std::find(cpu.isa.begin(), cpu.isa.end(), isa.get<std::string>()) != cpu.isa.end();
  };
  if (dev.kind == DeviceKind::cpu) {
    if (cls != "cpu") return fmt::format("{} is for a {}, and the device is a cpu", f.id(), cls);
    for (const auto& isa : match.value("isa", json::array()))
      if (!has_isa(isa)) return fmt::format("{} needs {}, which the cpu lacks", f.id(), isa.get<std::string>());
    for (const auto& isa : match.value("isa_absent", json::array()))
      if (has_isa(isa)) return fmt::format("{} is for a cpu without {}, which this one has", f.id(), isa.get<std::string>());
    if (match.contains("vendor") && match["vendor"].get<std::string>() != cpu.vendor)
      return fmt::format("{} is for vendor {}, and this cpu is {}", f.id(), match["vendor"].get<std::string>(),
                         cpu.vendor.empty() ? "of unknown vendor" : cpu.vendor);
    if (match.contains("family") && match["family"].get<int>() != cpu.family)
      return fmt::format("{} is for cpu family {}, and this one is {}", f.id(), match["family"].get<int>(),
                         cpu.family < 0 ? "of unknown family" : std::to_string(cpu.family));
    if (match.contains("logical_cores") && match["logical_cores"].get<int>() != cpu.logical_cores)
      return fmt::format("{} is for {} logical cores, and this cpu has {}", f.id(), match["logical_cores"].get<int>(),
                         cpu.logical_cores);
    return "";
  }
  if (dev.kind == DeviceKind::sim) {
    // A simulated device is made from one expected file: that one.
    const auto id = dev.props.find("hardware_id");
    if (id != dev.props.end() && id->is_string() && id->get<std::string>() == hw.value("id", "")) return "";
    return fmt::format("the simulated device is not made from {}", f.id());
  }
  if (cls != "gpu") return fmt::format("{} is for a {}, and the device is a gpu", f.id(), cls);
  std::string names;
  for (const auto& s : match.value("name_contains", json::array())) {
    if (dev.name.find(s.get<std::string>()) != std::string::npos) return "";
    names += (names.empty() ? "\"" : ", \"") + s.get<std::string>() + "\"";
  }
  return fmt::format("the gpu's name \"{}\" has none of {}'s names ({})", dev.name, f.id(), names);
}

bool expected_matches(const ExpectedFile& f, const DeviceInfo& dev, const CpuInfo& cpu) {
  return expected_mismatch(f, dev, cpu).empty();
}

std::optional<ExpectedFile> match_expected(const DeviceInfo& dev, const CpuInfo& cpu) {
  for (auto& f : load_expected_files())
    if (expected_matches(f, dev, cpu)) return f;
  return std::nullopt;
}

}  // namespace sb
