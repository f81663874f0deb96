// The Hugging Face hub cache's layout (huggingface_hub's file_download: models--{org}--{name}/
// refs/{revision} holding a commit hash, snapshots/{hash}/{file} as links into blobs/).
#include "diagnose/hf_cache.hpp"

#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem
#include <system_error>  // std::error_code

#include "harness/files.hpp"  // read_regular_file
#include "harness/text.hpp"   // trim

namespace sb::diagnose {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows the snapshot's link into blobs/
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

std::vector<std::string> hf_cache_dirs() {
  std::vector<std::string> out;
  auto add = [&](const std::string& d) {
    if (!d.empty() && is_dir(d)) out.push_back(d);
  };
  add(env("HF_HUB_CACHE"));
  if (const std::string h = env("HF_HOME"); !h.empty()) add(h + "/hub");
  add(env("TRANSFORMERS_CACHE"));
  if (const std::string x = env("XDG_CACHE_HOME"); !x.empty()) add(x + "/huggingface/hub");
  if (const std::string home = env("HOME"); !home.empty()) add(home + "/.cache/huggingface/hub");
  return out;
}

std::string find_model_config(const std::string& model, const std::vector<std::string>& cache_dirs) {
  if (model.empty()) return {};
  // a local model directory, as from_pretrained takes one
  if (is_dir(model) && is_file(fs::path(model) / "config.json")) return (fs::path(model) / "config.json").string();
  const auto slash = model.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == model.size() || model.find('/', slash + 1) != std::string::npos ||
      model.find("..") != std::string::npos)
    return {};  // not an org/name hub id
  const std::string repo = "models--" + model.substr(0, slash) + "--" + model.substr(slash + 1);
  for (const auto& dir : cache_dirs) {
    const fs::path root = fs::path(dir) / repo;
    if (!is_dir(root / "snapshots")) continue;
    // refs/main: the commit the default revision resolved to when it was downloaded
    if (is_file(root / "refs" / "main")) {
      try {
        const std::string hash(text::trim(read_regular_file((root / "refs" / "main").string(), "hub cache ref", 256)));
        if (!hash.empty() && hash.find('/') == std::string::npos && hash.find("..") == std::string::npos &&
            is_file(root / "snapshots" / hash / "config.json"))
          return (root / "snapshots" / hash / "config.json").string();
      } catch (const std::exception&) {
        // an unreadable ref: fall back to the snapshots
      }
    }
    fs::path best;
    fs::file_time_type newest{};
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root / "snapshots", ec)) {
      const fs::path c = e.path() / "config.json";
      if (!is_file(c)) continue;
      const auto t = fs::last_write_time(e.path(), ec);
      if (best.empty() || (!ec && t > newest)) {
        best = c;
        newest = t;
      }
    }
    if (!best.empty()) return best.string();
  }
  return {};
}

}  // namespace sb::diagnose
