// The Axolotl config embedded in a model card (config.hpp's axolotl_card).
#include <algorithm>  // std::count
#include <string>     // std::string

#include "diagnose/config.hpp"
#include "harness/errors.hpp"  // UsageError

namespace sb::diagnose {

std::optional<AxolotlCard> axolotl_card(const std::string& text) {
  constexpr std::string_view kSummary = "<summary>See axolotl config</summary>";
  const std::size_t at = text.find(kSummary);
  if (at == std::string::npos) return std::nullopt;
  AxolotlCard card;
  std::size_t from = at + kSummary.size();
  constexpr std::string_view kVersion = "axolotl version: `";
  const std::size_t v = text.find(kVersion, from);
  const std::size_t fence = text.find("```yaml", from);
  if (fence == std::string::npos)
    throw UsageError("the model card's axolotl config has no ```yaml block after 'See axolotl config'");
  if (v != std::string::npos && v < fence) {
    const std::size_t end = text.find('`', v + kVersion.size());
    if (end != std::string::npos && end - (v + kVersion.size()) <= 64)
      card.version = text.substr(v + kVersion.size(), end - (v + kVersion.size()));
  }
  const std::size_t body = text.find('\n', fence);
  if (body == std::string::npos) throw UsageError("the model card's ```yaml block is cut short");
  // the closing fence: a line that starts with ```
  const std::size_t close = text.find("\n```", body);
  if (close == std::string::npos) throw UsageError("the model card's ```yaml block is not closed (```)");
  if (text.find(kSummary, body) < close)
    throw UsageError("the model card's axolotl config holds another 'See axolotl config' block");
  const auto lines_before = std::count(text.begin(), text.begin() + std::ptrdiff_t(body + 1), '\n');
  card.yaml = std::string(std::size_t(lines_before), '\n') + text.substr(body + 1, close - body);
  return card;
}

}  // namespace sb::diagnose
