// --help wrapped to the terminal: CLI11 2.1's formatter prints each description on one line, so
// 13 of 47 option lines ran past 80 columns (diagnose --trace's: 330 characters). Here every
// option's name column and description, each command's line, the description and the footer are
// wrapped at the width: $COLUMNS, else the terminal's, else 80 (a pipe, help2man), at least 60.
#include <sys/ioctl.h>  // ioctl, TIOCGWINSZ
#include <unistd.h>     // isatty, STDOUT_FILENO

#include <algorithm>  // std::clamp
#include <cstdlib>    // std::getenv, std::strtoul
#include <memory>     // std::make_shared
#include <sstream>    // std::istringstream
#include <string>     // std::string
#include <vector>     // std::vector

#include "app/app.hpp"

namespace sb::app {
namespace {

std::size_t help_width() {
  constexpr std::size_t kLeast = 60, kMost = 160, kDefault = 80;
  if (const char* c = std::getenv("COLUMNS"); c && *c) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(c, &end, 10);
    if (end && *end == '\0' && v > 0) return std::clamp<std::size_t>(v, kLeast, kMost);
  }
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return std::clamp<std::size_t>(ws.ws_col, kLeast, kMost);
  return kDefault;
}

// `text` in lines of at most `width` characters (a longer word stays whole), each line after the
// first of a paragraph indented by `indent` more than the paragraph's own leading spaces. Lines the
// text breaks itself are kept.
std::vector<std::string> wrap_lines(const std::string& text, std::size_t width, std::size_t indent) {
  std::vector<std::string> out;
  std::istringstream paragraphs(text);
  for (std::string para; std::getline(paragraphs, para);) {
    const std::size_t lead = std::min(para.find_first_not_of(' '), para.size());
    const std::string own(lead, ' '), cont(lead + indent, ' ');
    std::istringstream words(para.substr(lead));
    std::string line = own;
    bool empty = true;
    for (std::string w; words >> w;) {
      if (!empty && line.size() + 1 + w.size() > width) {
        out.push_back(line);
        line = cont;
        empty = true;
      }
      line += (empty ? "" : " ") + w;
      empty = false;
    }
    out.push_back(line);
  }
  if (out.empty()) out.emplace_back();
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

class WrappingFormatter : public CLI::Formatter {
 public:
  explicit WrappingFormatter(std::size_t width) : width_(width) {}

  std::string make_option(const CLI::Option* opt, bool is_positional) const override {
    return entry(make_option_name(opt, is_positional) + make_option_opts(opt), make_option_desc(opt));
  }
  std::string make_subcommand(const CLI::App* sub) const override {
    return entry(sub->get_display_name(true), sub->get_description());
  }
  std::string make_description(const CLI::App* app) const override {
    const std::string d = CLI::Formatter::make_description(app);
    return d.empty() ? d : join_lines(wrap_lines(d.substr(0, d.find_last_not_of('\n') + 1), width_, 0));
  }
  std::string make_footer(const CLI::App* app) const override {
    const std::string f = app->get_footer();
    return f.empty() ? f : join_lines(wrap_lines(f, width_, 2));
  }

 private:
  // "  NAME [OPTS]" in the first column (wrapped itself when it is long: Excludes lists), the
  // description beside it from column column_width_, or under it when the name is too long.
  std::string entry(const std::string& name, const std::string& desc) const {
    const std::size_t col = column_width_;
    std::vector<std::string> head = wrap_lines("  " + name, width_, 4);
    std::string out;
    for (std::size_t i = 0; i + 1 < head.size(); ++i) out += head[i] + "\n";
    std::string last = head.back();
    if (desc.empty()) return out + last + "\n";
    const std::vector<std::string> body = wrap_lines(desc, std::max<std::size_t>(width_ - col, 20), 0);
    if (last.size() >= col || head.size() > 1) {
      out += last + "\n";
      last.clear();
    }
    last.resize(col, ' ');
    out += last + body.front() + "\n";
    for (std::size_t i = 1; i < body.size(); ++i) out += std::string(col, ' ') + body[i] + "\n";
    return out.substr(0, out.size() - 1) + "\n";
  }

  std::size_t width_;
};

}  // namespace

std::string wrap_help_text(const std::string& text, std::size_t indent) {
  return join_lines(wrap_lines(text, help_width(), indent));
}

void use_wrapping_help(CLI::App& app) { app.formatter(std::make_shared<WrappingFormatter>(help_width())); }

}  // namespace sb::app
