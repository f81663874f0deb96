// The stallbench command line: the composition root. main_impl makes the CLI11 app, each
// add_<command>() (app.hpp) wires one command's options, and the command parsed runs. Exit codes
// (README "Exit codes"):
//   0 success; 1 a point failed or a library call failed; 2 bad input;
//   3 compare: a metric is worse than --tolerance; 4 a hang was caught;
//   5 collective: a rank's library failed a collective (a mismatch that
//   errored instead of hanging); the job was ended after the dumps.
#include <sys/stat.h>  // fstat: is stdout a pipe
#include <unistd.h>    // STDOUT_FILENO

#include <algorithm>    // std::find
#include <iostream>     // std::cout, std::cerr
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "app/app.hpp"               // add_<command>
#include "harness/errors.hpp"        // Error, UsageError, terminal_safe
#include "harness/exit_codes.hpp"    // kExit*
#include "harness/files.hpp"         // terminal_safe
#include "harness/fingerprint.hpp"   // build_info
#include "harness/temp_files.hpp"    // install_temp_file_cleanup

namespace sb::app {
namespace {

int main_impl(int argc, char** argv) {
  CLI::App app{"stallbench: reproduce, one by one, the causes that make a fine-tuning job slow or stuck,\n"
               "measure them on this machine, and compare with expected numbers for the hardware."};
  app.name("stallbench");  // the usage line says stallbench, not argv[0]'s path (build/, a venv's _bin/)
  use_wrapping_help(app);
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("stallbench {} ({})", build_info().version, build_info().git_sha));
  app.footer("exit codes: 0 ok, 1 failure, 2 bad input, 3 compare regression, 4 hang caught,\n"
             "            5 a collective failed in the library (collective scenario; dumps written)");
  int early_exit = -1;
  const std::vector<Command> commands{add_list(app),    add_devices(app, argc, argv),
                                      add_run(app, argc, argv),
                                      add_diagnose(app, argc, argv),
                                      add_watch(app, argc, argv, &early_exit),
                                      add_compare(app), add_analyze_hang(app), add_clean(app)};
  if (early_exit >= 0) return early_exit;

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    const int rc = app.exit(e);
    for (const Command& c : commands)
      if (c.more_help) c.more_help();
    return rc;
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A first word that is no command ("stallbench frobnicate"): name it, and the commands.
    if (argc > 1 && argv[1][0] != '-') {
      const std::string word = argv[1];
      std::vector<std::string> names;
      for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
      if (std::find(names.begin(), names.end(), word) == names.end()) {
        std::cerr << fmt::format("stallbench: unknown command '{}'; valid: {}\n", word, fmt::join(names, ", "));
        std::cerr << "run 'stallbench --help' for usage\n";
        return kExitUsage;
      }
    }
    // CLI11's wording for an option given twice, "--json: At Most 1 required but received 2",
    // read as a count of required values: say what happened.
    std::string what = e.what();
    static constexpr std::string_view kTwice = "At Most 1 required but received ";
    if (const auto at = what.find(kTwice); at != std::string::npos)
      what = what.substr(0, at) + "given " + what.substr(at + kTwice.size()) + " times; give it once";
    std::cerr << "stallbench: " << what << "\n";
    std::cerr << "run 'stallbench --help' (or 'stallbench <command> --help') for usage\n";
    return kExitUsage;
  }

  for (const Command& c : commands)
    if (c.sub->parsed()) return c.run();
  return kExitUsage;
}

}  // namespace
}  // namespace sb::app

int main(int argc, char** argv) {
  sb::install_temp_file_cleanup();  // a signal never leaves a half-written file behind
  try {
    const int rc = sb::app::main_impl(argc, argv);
    // A table or report that could not be written (stdout on a full disk, `> /dev/full`) is a
    // failure the user must see, never exit 0. A pipe whose reader left (`watch | head -1`) is
    // not: watch goes on by design, and elsewhere SIGPIPE ends the run as for any tool.
    std::cout.flush();
    struct stat out {};
    const bool pipe = ::fstat(STDOUT_FILENO, &out) == 0 && (S_ISFIFO(out.st_mode) || S_ISSOCK(out.st_mode));
    if (!std::cout && !pipe) {
      std::cerr << "stallbench: cannot write to stdout (closed, or the disk is full): its output is lost\n";
      return rc == 0 ? 1 : rc;
    }
    return rc;
  } catch (const sb::UsageError& e) {  // a message may quote the user's bytes: never raw to the terminal
    std::cerr << "stallbench: " << sb::terminal_safe(e.what()) << "\n";
    return 2;
  } catch (const sb::Error& e) {
    std::cerr << "stallbench: " << sb::to_string(e.kind()) << " error: " << sb::terminal_safe(e.what()) << "\n";
    return e.kind() == sb::ErrorKind::hang ? sb::kExitHang : 1;
  } catch (const std::exception& e) {
    std::cerr << "stallbench: error: " << sb::terminal_safe(e.what()) << "\n";
    return 1;
  }
}
