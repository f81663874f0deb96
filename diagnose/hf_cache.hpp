// The model's config.json where a user's machine already has it: the Hugging Face hub cache (what
// from_pretrained downloaded) or a local model directory. Never the network. A config names its model
// by hub id (base_model: meta-llama/Llama-3.2-1B) and carries none of its dimensions; without this the
// diagnosis ran Llama-2-7B's.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

namespace sb::diagnose {

// Where the hub cache is, in transformers' and huggingface_hub's order: $HF_HUB_CACHE, $HF_HOME/hub,
// $TRANSFORMERS_CACHE (older transformers), $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub.
// Only those that exist, first wins.
std::vector<std::string> hf_cache_dirs();

// The config.json of `model` (a hub id "org/name", or a local directory holding one): the snapshot
// refs/main names, else the newest snapshot that has one, in the first cache dir that has the model;
// "" when none has it. Nothing is read but directory entries and refs/main.
std::string find_model_config(const std::string& model, const std::vector<std::string>& cache_dirs);

}  // namespace sb::diagnose
