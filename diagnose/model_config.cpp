// A Hugging Face config.json read as its family's config class reads it (config.hpp:
// apply_model_config): the model's dims for diagnose, its family, its MLP and K/V heads.
#include "diagnose/config.hpp"

#include <algorithm>    // std::find
#include <optional>     // std::optional
#include <string_view>  // std::string_view
#include <utility>      // std::pair

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"     // sb::UsageError
#include "harness/files.hpp"      // read_regular_file, quoted_text
#include "harness/json_read.hpp"  // parse_json_text, JsonRef, reading_file

namespace sb::diagnose {

using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kDefault = "default";

}  // namespace

namespace {

// Families whose config.json names the dims its own way (Hugging Face's attribute_map and __init__
// keywords: GPT2Config's n_embd, n_layer, n_head, n_inner; MptConfig's d_model, n_layers, n_heads; ...):
// read where the standard name is missing, and said so. "" where the family uses the standard name.
struct DimAliases {
  std::string_view hidden, layers, heads, inter;
};
constexpr std::pair<std::string_view, DimAliases> kDimAliases[] = {
    {"gpt2", {"n_embd", "n_layer", "n_head", "n_inner"}},
    {"gptj", {"n_embd", "n_layer", "n_head", "n_inner"}},
    {"codegen", {"n_embd", "n_layer", "n_head", "n_inner"}},
    {"gpt_bigcode", {"n_embd", "n_layer", "n_head", "n_inner"}},
    {"gpt_neo", {"", "num_layers", "num_heads", ""}},
    {"opt", {"", "", "", "ffn_dim"}},
    {"bloom", {"n_embed", "n_layer", "n_head", ""}},
    {"falcon", {"", "n_layer", "n_head", "ffn_hidden_size"}},
    {"RefinedWeb", {"", "n_layer", "n_head", "ffn_hidden_size"}},
    {"RefinedWebModel", {"", "n_layer", "n_head", "ffn_hidden_size"}},
    {"mpt", {"d_model", "n_layers", "n_heads", ""}},
    // encoder-decoders: T5's own names (T5Config: d_model, num_layers, num_heads, d_ff)
    {"t5", {"d_model", "num_layers", "num_heads", "d_ff"}},
    {"mt5", {"d_model", "num_layers", "num_heads", "d_ff"}},
    {"umt5", {"d_model", "num_layers", "num_heads", "d_ff"}},
    {"longt5", {"d_model", "num_layers", "num_heads", "d_ff"}},
    // the remote-code phi-1.5/phi-2 configs of 2023 ("mixformer-sequential", "phi-msft": n_embd, n_layer,
    // n_head, n_inner), before transformers' own phi
    {"phi-msft", {"n_embd", "n_layer", "n_head", "n_inner"}},
    {"mixformer-sequential", {"n_embd", "n_layer", "n_head", "n_inner"}},
};
// Families that are not decoder-only: what the step models of them is said.
constexpr std::pair<std::string_view, std::string_view> kNotDecoderOnly[] = {
    {"t5", "an encoder-decoder: the step models one stack of num_layers (the other stack and the decoder's "
           "cross-attention are not modelled)"},
    {"mt5", "an encoder-decoder: one stack modelled"},
    {"umt5", "an encoder-decoder: one stack modelled"},
    {"longt5", "an encoder-decoder: one stack modelled"},
    {"bart", "an encoder-decoder: one stack modelled"},
    {"whisper", "an encoder-decoder: one stack modelled"},
    {"bert", "an encoder: the step is causal self-attention, a bidirectional encoder's cost is the same "
             "shapes without the causal mask"},
    {"roberta", "an encoder: the step's shapes, causal masking aside"},
};
DimAliases aliases_of(std::string_view type) {
  for (const auto& [t, a] : kDimAliases)
    if (t == type) return a;
  return {};
}

// The two-matrix MLPs by family (every other family with an intermediate_size is gated: Llama, Mistral,
// Qwen, Gemma, Phi-3, OLMo, Mixtral, ...).
constexpr std::string_view kPlain[] = {"gpt2", "gpt_neox", "gpt_bigcode", "gptj",       "gpt_neo",
                                       "bert", "roberta",  "opt",         "bloom",      "falcon",
                                       "mpt",  "phi",      "starcoder2",  "codegen",    "RefinedWeb",
                                       "RefinedWebModel", "nemotron", "persimmon",  // these two: squared ReLU
                                       "t5", "mt5", "umt5", "longt5", "phi-msft", "mixformer-sequential"};
// Families whose Hugging Face config class ties the LM head to the embedding unless told otherwise, and
// those that do not: the reading of a config.json that leaves tie_word_embeddings out.
constexpr std::string_view kTiedByDefault[] = {"gpt2", "gpt_bigcode", "gpt_neo", "opt", "bloom",
                                               "falcon", "RefinedWeb", "RefinedWebModel", "mpt", "bert",
                                               "roberta", "starcoder2", "gemma", "gemma2", "gemma3", "gemma3_text"};
constexpr std::string_view kUntiedByDefault[] = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
                                                 "qwen3_moe", "gpt_neox", "gptj", "codegen", "phi", "phi3",
                                                 "phimoe", "olmo", "olmo2", "olmoe", "stablelm", "cohere"};
// Layers the decoder step is not: attention with low-rank K/V compression (DeepSeek's MLA), state-space
// layers, an MoE configured under a nested key. Refused, with the way to a stand-in.
constexpr std::pair<std::string_view, std::string_view> kNotModelled[] = {
    {"deepseek_v2", "multi-head latent attention (low-rank K/V) and dense first layers"},
    {"deepseek_v3", "multi-head latent attention (low-rank K/V) and dense first layers"},
    {"dbrx", "its mixture of experts configured under ffn_config"},
    {"jamba", "Mamba layers between its attention layers"},
    {"mamba", "state-space layers, no attention"},
    {"mamba2", "state-space layers, no attention"},
    {"falcon_mamba", "state-space layers, no attention"},
    {"rwkv", "recurrent layers, no attention"},
};
template <std::size_t N>
bool listed(const std::string_view (&names)[N], std::string_view type) {
  return std::find(std::begin(names), std::end(names), type) != std::end(names);
}

// A family whose layer is not the step diagnose measures (MLA, SSMs): exit 2, saying how to diagnose a
// stand-in.
void refuse_unmodelled(const std::string& path, std::string_view type, const std::string& qtype) {
  for (const auto& [t, why] : kNotModelled)
    if (type == t)
      throw UsageError(fmt::format(
          "{}: model_type {}: {} is not the decoder layer diagnose measures; give the dims as keys of the training "
          "config (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size, and "
          "num_experts, num_experts_per_tok, moe_intermediate_size for a mixture of experts) to diagnose a "
          "stand-in, or leave --model-config out",
          path, qtype, why));
}

// The K/V heads a config.json gives: num_key_value_heads, else the family's own keys for multi-query and
// grouped-query attention (Falcon's multi_query, true by default, or num_kv_heads with
// new_decoder_architecture; GPT-BigCode's multi_query, true by default; MPT's attn_config); nothing
// where it gives none (one per attention head). ref: where a count that is not a divisor is reported.
struct KvHeads {
  std::optional<std::int64_t> kv;
  std::optional<JsonRef> ref;
  std::string key;
};
KvHeads family_kv_heads(const JsonRef& from, const std::string& type) {
  const auto given = [](const std::optional<JsonRef>& r) { return r && !r->raw().is_null(); };
  std::optional<std::int64_t> kv;
  std::optional<JsonRef> kv_ref;
  std::string kv_key;
  // Falcon's and BigCode's multi_query, true when the file leaves it out: one K/V head
  const auto multi_query = [&] {
    const auto mq = from.find("multi_query");
    if (given(mq) && !mq->boolean()) return;
    kv = 1;
    kv_key = given(mq) ? "multi_query" : "multi_query, true by default";
  };
  if (const auto k = from.find("num_key_value_heads"); given(k)) {
    kv = k->integer(1, kMaxHidden);
    kv_ref = k;
    kv_key = "num_key_value_heads";
  } else if (type == "falcon" || type == "RefinedWeb" || type == "RefinedWebModel") {
    const auto nda = from.find("new_decoder_architecture");
    const bool new_arch = type == "RefinedWeb" || (given(nda) && nda->boolean());
    if (new_arch) {
      for (const std::string_view key : {"num_kv_heads", "n_head_kv"})
        if (const auto n = from.find(key); !kv && given(n)) {
          kv = n->integer(1, kMaxHidden);
          kv_ref = n;
          kv_key = std::string(key) + " (new_decoder_architecture)";
        }
    } else {
      multi_query();
    }
  } else if (type == "gpt_bigcode") {
    multi_query();
  } else if (type == "mpt") {
    if (const auto ac = from.find("attn_config"); given(ac) && ac->raw().is_object()) {
      const auto at = ac->find("attn_type");
      const std::string t = given(at) ? at->str() : std::string();
      if (t == "multiquery_attention") {
        kv = 1;
        kv_key = "attn_config.attn_type multiquery_attention";
      } else if (t == "grouped_query_attention") {
        if (const auto n = ac->find("kv_n_heads"); given(n)) {
          kv = n->integer(1, kMaxHidden);
          kv_ref = n;
          kv_key = "attn_config.kv_n_heads";
        }
      }
    }
  }
  return {kv, kv_ref, kv_key};
}

}  // namespace

void apply_model_config(TrainConfig& cfg, const std::string& config_json_path) {
  apply_model_config_text(cfg, read_regular_file(config_json_path, "model config"), config_json_path);
}

void apply_model_config_text(TrainConfig& cfg, const std::string& text, const std::string& path) {
  const json doc = parse_json_text(text, path);
  TrainConfig out = cfg;
  reading_file(path, [&] {
    JsonRef root(doc, path);
    root.object();
    const auto given = [](const std::optional<JsonRef>& r) { return r && !r->raw().is_null(); };
    // model_type, where given: a number or a list is "FILE: model_type: expected a string"
    const auto type_of = [&](const JsonRef& at) {
      const auto t = at.find("model_type");
      return given(t) ? std::optional<std::string>(t->str()) : std::nullopt;
    };
    struct Dim {
      std::string_view name;
      std::string_view DimAliases::*alias;
      std::int64_t* field;
      std::int64_t hi;
    };
    const Dim dims[] = {
        {"hidden_size", &DimAliases::hidden, &out.model.hidden_size, kMaxHidden},
        {"num_hidden_layers", &DimAliases::layers, &out.model.num_hidden_layers, kMaxLayers},
        {"num_attention_heads", &DimAliases::heads, &out.model.num_attention_heads, kMaxHidden},
        {"intermediate_size", &DimAliases::inter, &out.model.intermediate_size, kMaxIntermediate},
        {"vocab_size", nullptr, &out.model.vocab_size, kMaxVocab},
    };
    // The key a dim is read from: its standard name, else its family's name for it.
    const auto key_of = [&](const JsonRef& at, const Dim& d, std::string_view type) -> std::optional<std::string> {
      if (given(at.find(d.name))) return std::string(d.name);
      if (d.alias) {
        const std::string_view a = aliases_of(type).*(d.alias);
        if (!a.empty() && given(at.find(a))) return std::string(a);
      }
      return std::nullopt;
    };
    // A multimodal model (Llava, Gemma 3, ...) keeps its language model's dims in text_config.
    JsonRef from = root;
    std::string type = type_of(root).value_or("");
    bool any_at_top = false;
    for (const auto& d : dims) any_at_top = any_at_top || key_of(root, d, type).has_value();
    if (!any_at_top) {
      if (const auto tc = root.find("text_config"); tc && tc->raw().is_object()) {
        from = *tc;
        // its text_config names its language model's family; else the top level's
        if (const auto inner = type_of(from)) type = *inner;
        out.notes.push_back(fmt::format("{}: the model dims read from its text_config", path));
      }
    }
    const std::string qtype = quoted_text(type, 40);
    refuse_unmodelled(path, type, qtype);
    bool inter_given = false;
    std::vector<std::string> missing_shape;  // refused at the end, after the file's own errors
    for (const auto& d : dims) {
      const std::string name = "model." + std::string(d.name);
      const auto key = key_of(from, d, type);
      if (!key) {
        // the layer's shape is not replaced by a default: a shape the file does not give is refused unless
        // the training config gave it (a width without its key is inferred below; the vocabulary is kept)
        const bool shape = d.field != &out.model.intermediate_size && d.field != &out.model.vocab_size;
        if (shape && source_of(out, name) == kDefault) missing_shape.emplace_back(d.name);
        if (d.field != &out.model.intermediate_size)  // the MLP's width without its key: below
          out.notes.push_back(fmt::format("{}: no {}; {} ({}) kept", path, d.name, *d.field, source_of(out, name)));
        continue;
      }
      const std::int64_t x = from.at(*key).integer(1, d.hi);
      const std::string before = source_of(out, name);
      if (x != *d.field && before != kDefault)
        out.notes.push_back(fmt::format("{}: {} {} replaces {} from {}", path, d.name, x, *d.field, before));
      if (*key != d.name) out.notes.push_back(fmt::format("{}: {} {} read from {} ({}'s name for it)", path, d.name, x, *key, qtype));
      *d.field = x;
      out.sources[name] = Source{*key == d.name ? path : path + " (" + *key + ")"};
      inter_given = inter_given || d.field == &out.model.intermediate_size;
    }
    const auto& m = out.model;
    if (m.hidden_size % m.num_attention_heads != 0)
      throw UsageError(fmt::format("{}: num_attention_heads: {} ({}) does not divide hidden_size {} ({}); expected "
                                   "heads that divide the hidden size", path, m.num_attention_heads,
                                   source_of(out, "model.num_attention_heads"), m.hidden_size,
                                   source_of(out, "model.hidden_size")));
    for (const auto& [t, what] : kNotDecoderOnly)
      if (type == t) out.notes.push_back(fmt::format("{}: model_type {} is {}", path, qtype, what));
    if (!type.empty()) {
      out.model_family = type;
      out.sources["model_type"] = Source{path};
    }
    // The MLP's kind from the model's family.
    const bool plain = listed(kPlain, type);
    if (!type.empty()) {
      const std::string before = source_of(out, "model.gated_mlp");
      if (!plain != out.model.gated_mlp && before != kDefault)
        out.notes.push_back(fmt::format("{}: model_type {} sets gated_mlp {}, replacing {} from {}", path, qtype, !plain,
                                        out.model.gated_mlp, before));
      out.model.gated_mlp = !plain;
      out.sources["model.gated_mlp"] = Source{path};
    } else {
      out.notes.push_back(fmt::format("{}: no model_type; gated_mlp {} ({}) kept", path, out.model.gated_mlp,
                                      source_of(out, "model.gated_mlp")));
    }
    // A plain MLP without its width given is 4 x hidden, as its config class makes it (GPT-2's n_inner
    // None, BLOOM's and Falcon's 4 x hidden, MPT's expansion_ratio, 4 by default); a gated one keeps the
    // value it had, said so.
    if (!inter_given) {
      if (plain) {
        std::int64_t ratio = 4;
        std::string why = "4 x hidden, as its config class makes it";
        if (const auto er = from.find("expansion_ratio"); type == "mpt" && given(er)) {
          ratio = er->integer(1, 64);
          why = fmt::format("expansion_ratio {} x hidden", ratio);
        }
        out.model.intermediate_size = std::min(kMaxIntermediate, ratio * m.hidden_size);
        out.sources["model.intermediate_size"] = Source{path + " (" + why + ")"};
        out.notes.push_back(fmt::format("{}: no intermediate_size; {} for model_type {}: {}", path,
                                        out.model.intermediate_size, qtype, why));
      } else {
        out.notes.push_back(fmt::format("{}: no intermediate_size; {} ({}) kept", path, out.model.intermediate_size,
                                        source_of(out, "model.intermediate_size")));
      }
    }
    if (plain)
      out.notes.push_back(fmt::format("{}: model_type {}: a plain MLP (up and down, two hidden x {} matrices, not "
                                      "a gated one's three)",
                                      path, qtype, out.model.intermediate_size));
    // The K/V heads: num_key_value_heads, else the family's own keys for multi-query and grouped-query
    // attention (Falcon's multi_query, true by default, or num_kv_heads with new_decoder_architecture;
    // GPT-BigCode's multi_query, true by default; MPT's attn_config), else one per attention head.
    auto [kv, kv_ref, kv_key] = family_kv_heads(from, type);
    if (kv) {
      if (m.num_attention_heads % *kv != 0)  // a count of 1 (multi-query) always divides: kv_ref is set
        kv_ref->fail(fmt::format("expected a divisor of num_attention_heads {}, got {}", m.num_attention_heads, *kv));
      const std::string before = source_of(out, "model.num_key_value_heads");
      if (*kv != out.model.kv_heads() && before != kDefault)
        out.notes.push_back(fmt::format("{}: {} {} replaces {} from {}", path, kv_key, *kv, out.model.kv_heads(), before));
      out.model.num_key_value_heads = *kv;
      out.sources["model.num_key_value_heads"] =
          Source{kv_key == "num_key_value_heads" ? path : path + " (" + kv_key + ")"};
      const std::string_view kind = *kv == 1 ? "multi-query attention" : "grouped-query attention";
      if (*kv != m.num_attention_heads && kv_key == "num_key_value_heads")
        out.notes.push_back(fmt::format("{}: num_key_value_heads {} differs from num_attention_heads {}: {}, the K and "
                                        "V projections {}x smaller",
                                        path, *kv, m.num_attention_heads, kind, m.num_attention_heads / *kv));
      else if (*kv != m.num_attention_heads)
        out.notes.push_back(fmt::format("{}: {} K/V head(s) for {} attention heads ({}): {}, the K and V projections "
                                        "{}x smaller",
                                        path, *kv, m.num_attention_heads, kv_key, kind, m.num_attention_heads / *kv));
    } else if (out.model.num_key_value_heads > 0) {
      // Hugging Face's reading of a config.json without it: one K/V head per attention head
      out.notes.push_back(fmt::format("{}: no num_key_value_heads: one K/V head per attention head, not the {} of {}",
                                      path, out.model.num_key_value_heads,
                                      source_of(out, "model.num_key_value_heads")));
      out.model.num_key_value_heads = 0;
      out.sources["model.num_key_value_heads"] = Source{path};
    }
    // The LM head: tied to the embedding or a matrix of its own.
    {
      const auto tw = given(from.find("tie_word_embeddings")) ? from.find("tie_word_embeddings")
                                                              : root.find("tie_word_embeddings");
      bool tie = out.model.tie_word_embeddings;
      std::string src = path;
      if (given(tw)) {
        tie = tw->boolean();
      } else if (listed(kTiedByDefault, type) || listed(kUntiedByDefault, type)) {
        tie = listed(kTiedByDefault, type);
        src = fmt::format("{} (model_type {}'s default)", path, qtype);
      } else {
        src = source_of(out, "model.tie_word_embeddings");
        out.notes.push_back(fmt::format("{}: no tie_word_embeddings; {} ({}) kept: the LM head counted {}", path, tie,
                                        src, tie ? "as the embedding's matrix" : "as a matrix of its own"));
      }
      out.model.tie_word_embeddings = tie;
      out.sources["model.tie_word_embeddings"] = Source{src};
    }
    // A mixture of experts: how many, how many a token runs, each one's width, a shared one.
    {
      std::optional<JsonRef> experts;
      std::string ekey;
      for (const std::string_view key : {"num_local_experts", "num_experts", "n_routed_experts"})
        if (const auto e = from.find(key); !experts && given(e)) {
          experts = e;
          ekey = key;
        }
      const auto per_tok = from.find("num_experts_per_tok");
      if (experts && experts->integer(0, kMaxExperts) > 0) {
        const std::int64_t n = experts->integer(1, kMaxExperts);
        if (!given(per_tok)) experts->fail("given without num_experts_per_tok: expected both (a mixture of experts)");
        const std::int64_t k = per_tok->integer(1, n);
        out.model.num_experts = n;
        out.model.num_experts_per_tok = k;
        out.model.moe_intermediate_size = 0;
        out.model.shared_expert_intermediate_size = 0;
        if (const auto mi = from.find("moe_intermediate_size"); given(mi))
          out.model.moe_intermediate_size = mi->integer(1, kMaxIntermediate);
        if (const auto si = from.find("shared_expert_intermediate_size"); given(si))
          out.model.shared_expert_intermediate_size = si->integer(0, kMaxIntermediate);
        for (const std::string_view key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                           "shared_expert_intermediate_size"})
          out.sources["model." + std::string(key)] = Source{key == "num_experts" ? path + " (" + ekey + ")" : path};
        const auto& mm = out.model;
        out.notes.push_back(fmt::format(
            "{}: a mixture of experts: {} of {} experts of {} each run for a token{}: the measured step's MLP has a "
            "token's width ({}), the memory check holds every expert's weights ({} wide)",
            path, k, n, mm.expert_intermediate(),
            mm.shared_expert_intermediate_size > 0 ? fmt::format(", and a shared one of {}", mm.shared_expert_intermediate_size)
                                                   : std::string(),
            mm.active_intermediate(), mm.weight_intermediate()));
      } else if (out.model.moe()) {
        out.notes.push_back(fmt::format("{}: no experts: a dense MLP, not the {} experts of {}", path,
                                        out.model.num_experts, source_of(out, "model.num_experts")));
        out.model.num_experts = out.model.num_experts_per_tok = 0;
        out.model.moe_intermediate_size = out.model.shared_expert_intermediate_size = 0;
      }
    }
    // the layer's shape is never the default's in disguise: what neither file gave is refused
    if (!missing_shape.empty())
      throw UsageError(fmt::format(
          "{}: no {} (nor {}'s own name for it): the model's shape cannot be read from this file; give "
          "hidden_size, num_hidden_layers, num_attention_heads, intermediate_size and vocab_size as keys of the "
          "training config (they are kept), or pass the config.json of a model diagnose reads",
          path, fmt::join(missing_shape, ", "), type.empty() ? std::string("a file without model_type") : "model_type " + qtype));
  });
  cfg = std::move(out);
}


}  // namespace sb::diagnose
