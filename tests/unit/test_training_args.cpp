// training_args.bin (readers/training_args) and what it stands on: torch.save's zip
// (readers/torch_zip) and the pickle reader's objects, enums and allow-lists (readers/pickle). The
// real files are tests/data/run/transformers-*/, made by tests/data/run/make_training_args.py with
// transformers 4.46.3 and 5.25.0; the hostile ones are made here: every truncation, a flipped CRC,
// sizes past the end, wrong types, NaN, a global outside the allow-list (named, with its offset,
// never executed).
#include <cmath>       // std::isnan
#include <filesystem>  // std::filesystem
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format
#include <gtest/gtest.h>
#include <zlib.h>  // crc32

#include "harness/errors.hpp"         // UsageError
#include "harness/files.hpp"          // read_regular_file
#include "readers/pickle.hpp"         // PickleDoc, PickleGlobal
#include "readers/torch_zip.hpp"      // zip_entries, zip_read
#include "readers/training_args.hpp"  // parse_training_args

namespace sb {
namespace {

using json = nlohmann::ordered_json;

const std::string kData = SB_TEST_DATA "/run";
const char* kVersions[] = {"transformers-4.46.3", "transformers-5.25.0"};

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(char(x));
  return s;
}
std::string le(std::uint64_t v, int n) {
  std::string s;
  for (int k = 0; k < n; ++k) s.push_back(char((v >> (8 * k)) & 0xFF));
  return s;
}
std::string binunicode(const std::string& s) { return "X" + le(s.size(), 4) + s; }

// A zip of stored entries, as torch.save lays them out (no alignment padding: not needed to read).
std::string make_zip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, dir;
  for (const auto& [name, data] : entries) {
    const auto crc = std::uint32_t(crc32(0, reinterpret_cast<const Bytef*>(data.data()), uInt(data.size())));
    const std::size_t at = out.size();
    out += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(crc, 4) + le(data.size(), 4) +
           le(data.size(), 4) + le(name.size(), 2) + le(0, 2) + name + data;
    dir += le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(crc, 4) +
           le(data.size(), 4) + le(data.size(), 4) + le(name.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 2) +
           le(0, 4) + le(at, 4) + name;
  }
  const std::size_t dir_at = out.size();
  out += dir;
  out += le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(entries.size(), 2) + le(entries.size(), 2) + le(dir.size(), 4) +
         le(dir_at, 4) + le(0, 2);
  return out;
}

// A training_args.bin around a hand-made data.pkl.
std::string args_file(const std::string& pkl) {
  return make_zip({{"training_args/data.pkl", pkl}, {"training_args/byteorder", "little"},
                   {"training_args/version", "3\n"}});
}

// TrainingArguments with the fields given (each a key and its pickled value), as torch.save writes it.
std::string args_pickle(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string p = bytes({0x80, 2}) + "ctransformers.training_args\nTrainingArguments\n" + ")" + bytes({0x81}) + "}(";
  for (const auto& [k, v] : fields) p += binunicode(k) + v;
  return p + "ub.";
}

std::string error_of(const std::string& file_bytes) {
  try {
    parse_training_args(file_bytes, "ta.bin");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(PickleObjects, EnumsObjectsAndBuildAreRecordedNotRun) {
  constexpr PickleGlobal globals[] = {{"m", "Cls", PickleGlobal::Call::object},
                                      {"m", "Kind", PickleGlobal::Call::enum_value}};
  const PickleAllow allow{globals, "m's Cls and Kind"};
  // Cls() with state {'a': Kind('x'), 'b': <STACK_GLOBAL m.Cls>(1,)}
  std::string p = bytes({0x80, 4}) + "cm\nCls\n)" + bytes({0x81}) + "}(" + binunicode("a") + "cm\nKind\n" +
                  binunicode("x") + bytes({0x85}) + "R" + binunicode("b") + bytes({0x8c, 1}) + "m" +
                  bytes({0x8c, 3}) + "Cls" + bytes({0x93}) + bytes({'K', 1, 0x85}) + "Rub.";
  const PickleDoc doc(p, "t", nullptr, allow);
  const auto root = doc.root();
  ASSERT_TRUE(root.is_object());
  EXPECT_EQ(root.global()->name, "Cls");
  const auto a = root.state()->find("a");
  ASSERT_TRUE(a && a->is_object());
  EXPECT_EQ(a->global()->name, "Kind");
  EXPECT_EQ(a->state()->str(), "x");
  EXPECT_EQ(doc.to_json(), json::parse(R"({"a": "x", "b": [1]})"));
  // the Flight Recorder's default list refuses them, naming the global and its offset
  try {
    PickleDoc refused(p, "t");
    FAIL() << "m.Cls accepted by the default allow-list";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("global m.Cls refused"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at offset 2"), std::string::npos) << e.what();
  }
  // BUILD on a value that is no object, an enum of two values, NEWOBJ of an identity helper
  for (const std::string& bad : {bytes({0x80, 2}) + "}}b.", bytes({0x80, 2}) + "cm\nKind\n" + bytes({'K', 1, 'K', 2, 0x86}) + "R.",
                                 bytes({0x80, 2}) + "cm\nKind\n" + bytes({'N', 0x81}) + "."})
    EXPECT_THROW(PickleDoc(bad, "t", nullptr, allow), UsageError) << testing::PrintToString(bad);
}

TEST(TorchZip, TheRealFilesEntriesAndEveryTruncation) {
  const std::string file = kData + "/transformers-5.25.0/bf16_w4_gc.bin";
  const std::string b = read_regular_file(file, "t");
  const auto entries = zip_entries(b, file);
  ASSERT_GE(entries.size(), 3u);
  EXPECT_EQ(entries.front().name, "bf16_w4_gc/data.pkl");
  for (const auto& e : entries) {
    EXPECT_EQ(e.method, 0) << e.name;  // torch.save stores
    EXPECT_EQ(zip_read(b, e, file).size(), e.size);
  }
  // every prefix: an error naming the file, never a crash or a read past the end
  for (std::size_t n = 0; n < b.size(); n += 7)
    EXPECT_THROW(parse_training_args(std::string_view(b).substr(0, n), file), UsageError) << n;
}

TEST(TorchZip, DamageIsNamedWithItsOffset) {
  const std::string good = args_file(args_pickle({{"bf16", bytes({0x88})}}));
  ASSERT_EQ(error_of(good), "");
  std::string flipped = good;
  flipped[30 + 22 + 8] ^= 0x20;  // a byte of data.pkl (after the 30-byte local header and its 22-byte name)
  EXPECT_NE(error_of(flipped).find("CRC-32"), std::string::npos) << error_of(flipped);
  // a central directory entry whose size runs past the file
  std::string huge = good;
  const auto dir = huge.find(std::string("PK\x01\x02", 4));
  ASSERT_NE(dir, std::string::npos);
  huge.replace(dir + 20, 8, le(0x0FFFFFF0, 4) + le(0x0FFFFFF0, 4));
  EXPECT_NE(error_of(huge).find("past the end"), std::string::npos) << error_of(huge);
  // sizes saturated for ZIP64 without the extra field
  std::string z64 = good;
  z64.replace(dir + 20, 8, le(0xFFFFFFFF, 4) + le(0xFFFFFFFF, 4));
  EXPECT_NE(error_of(z64).find("ZIP64"), std::string::npos) << error_of(z64);
  EXPECT_NE(error_of("not a zip at all").find("not a torch.save file"), std::string::npos);
  EXPECT_NE(error_of(make_zip({{"x/other.pkl", "x"}})).find("data.pkl"), std::string::npos);
  // the legacy format: a pickle whose first value is the 10-byte magic number
  EXPECT_NE(error_of(bytes({0x80, 2, 0x8a, 10, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'}))
                .find("legacy"),
            std::string::npos);
}

TEST(TrainingArgs, TheRealFilesOfBothReleases) {
  for (const char* v : kVersions) {
    SCOPED_TRACE(v);
    const std::string dir = kData + "/" + v;
    const TrainingArgs a = read_training_args(dir + "/bf16_w4_gc.bin");
    EXPECT_EQ(a.class_name, "transformers.training_args.TrainingArguments");
    EXPECT_EQ(a.per_device_train_batch_size, 8);
    EXPECT_EQ(a.gradient_accumulation_steps, 4);
    EXPECT_EQ(a.bf16, true);
    EXPECT_EQ(a.fp16, false);
    EXPECT_EQ(a.dataloader_num_workers, 4);
    EXPECT_EQ(a.dataloader_pin_memory, false);  // use_cpu (no GPU to make the file on) turns pinning off
    EXPECT_EQ(a.gradient_checkpointing, true);
    EXPECT_EQ(a.lr_scheduler_type, "cosine");
    EXPECT_EQ(a.learning_rate, 2e-4);
    EXPECT_EQ(a.warmup_steps, 100.0);
    EXPECT_EQ(a.max_steps, 1000);
    EXPECT_EQ(a.world_size, 1);
    EXPECT_EQ(a.logging_nan_inf_filter, true);
    EXPECT_EQ(a.torch_compile, false);
    ASSERT_TRUE(a.optim);
    EXPECT_EQ(a.optim->rfind("adamw_torch", 0), 0u) << *a.optim;  // adamw_torch (4.46), adamw_torch_fused (5)
    EXPECT_FALSE(a.transformers_version);  // TrainingArguments records none
    EXPECT_FALSE(a.version_hint.empty());
    const TrainingArgs f = read_training_args(dir + "/fp16_w0.bin");
    EXPECT_EQ(f.fp16, true);
    EXPECT_EQ(f.bf16, false);
    EXPECT_EQ(f.dataloader_num_workers, 0);
    EXPECT_EQ(f.dataloader_pin_memory, false);
    EXPECT_EQ(f.lr_scheduler_type, "linear");
    EXPECT_EQ(f.num_train_epochs, 3.0);
    const TrainingArgs d = read_training_args(dir + "/defaults.bin");
    EXPECT_EQ(d.per_device_train_batch_size, 8);
    EXPECT_EQ(d.learning_rate, 5e-5);
    EXPECT_EQ(d.bf16, false);
    EXPECT_EQ(d.gradient_checkpointing, false);
    EXPECT_EQ(d.max_steps, -1);
    EXPECT_EQ(d.dataloader_pin_memory, true);
  }
  // what the two releases differ in, each read where it is
  const TrainingArgs old = read_training_args(kData + "/transformers-4.46.3/defaults.bin");
  EXPECT_TRUE(old.logging_dir);
  EXPECT_EQ(old.warmup_ratio, 0.0);
  EXPECT_NE(old.version_hint.find("4.41"), std::string::npos) << old.version_hint;
  const TrainingArgs now = read_training_args(kData + "/transformers-5.25.0/defaults.bin");
  EXPECT_FALSE(now.logging_dir);
  EXPECT_EQ(now.include_num_input_tokens_seen, "no");
  EXPECT_NE(now.version_hint.find("5 or later"), std::string::npos) << now.version_hint;
}

// TRL's TrainingArguments subclasses as TRL 1.16.0 saves them (make_training_args.py --trl): the classes are
// on the allow-list, max_length and packing are read, and TRL's own defaults are what the pickle holds
// (bf16 and gradient checkpointing on though the script set neither on DPOConfig).
TEST(TrainingArgs, TrlsConfigsAsTrlSavesThem) {
  const std::string dir = kData + "/trl-1.16.0";
  const TrainingArgs sft = read_training_args(dir + "/sft_packed_bf16.bin");
  EXPECT_EQ(sft.class_name, "trl.trainer.sft_config.SFTConfig");
  EXPECT_EQ(sft.max_seq_length, 2048);
  EXPECT_EQ(sft.packing, true);
  EXPECT_EQ(sft.bf16, true);
  EXPECT_EQ(sft.per_device_train_batch_size, 4);
  EXPECT_EQ(sft.gradient_accumulation_steps, 8);
  EXPECT_DOUBLE_EQ(sft.learning_rate.value_or(0), 2e-5);
  const TrainingArgs dpo = read_training_args(dir + "/dpo_lr5e-7.bin");
  EXPECT_EQ(dpo.class_name, "trl.trainer.dpo_config.DPOConfig");
  EXPECT_DOUBLE_EQ(dpo.learning_rate.value_or(0), 5e-7);
  EXPECT_EQ(dpo.max_seq_length, 1024);
  EXPECT_EQ(dpo.bf16, true);                    // TRL's default, not the script's
  EXPECT_EQ(dpo.gradient_checkpointing, true);  // TRL's default
}

// Axolotl 0.19.0's own classes as it saves them (make_training_args.py --axolotl): AxolotlTrainingArguments
// with its sample_packing and max_seq_length, AxolotlDPOConfig (defined in axolotl.core.trainers.dpo.args).
// Without a GPU transformers turns pin_memory off, so the file says False.
TEST(TrainingArgs, AxolotlsConfigsAsAxolotlSavesThem) {
  const std::string dir = kData + "/axolotl-0.19.0";
  const TrainingArgs sft = read_training_args(dir + "/sft_packed_bf16.bin");
  EXPECT_EQ(sft.class_name, "axolotl.core.training_args.AxolotlTrainingArguments");
  EXPECT_EQ(sft.max_seq_length, 4096);
  EXPECT_EQ(sft.packing, true);
  EXPECT_EQ(sft.bf16, true);
  EXPECT_EQ(sft.per_device_train_batch_size, 2);
  EXPECT_EQ(sft.gradient_accumulation_steps, 4);
  EXPECT_EQ(sft.dataloader_num_workers, 1);
  EXPECT_EQ(sft.dataloader_prefetch_factor, 256);
  EXPECT_EQ(sft.dataloader_pin_memory, false);
  const TrainingArgs dpo = read_training_args(dir + "/dpo_lr5e-7.bin");
  EXPECT_EQ(dpo.class_name, "axolotl.core.trainers.dpo.args.AxolotlDPOConfig");
  EXPECT_DOUBLE_EQ(dpo.learning_rate.value_or(0), 5e-7);
  EXPECT_EQ(dpo.max_seq_length, 2048);
}

TEST(TrainingArgs, AForbiddenGlobalIsNamedWithItsOffsetAndNeverRun) {
  const std::string m = error_of(read_regular_file(kData + "/forbidden_global.bin", "t"));
  EXPECT_NE(m.find("global os.system refused"), std::string::npos) << m;
  EXPECT_NE(m.find("at offset 2"), std::string::npos) << m;
  EXPECT_NE(m.find("data.pkl"), std::string::npos) << m;
  // inside the real object, among its fields: refused where it stands
  const std::string inside = args_pickle({{"optim", "cposix\nsystem\n" + binunicode("true") + bytes({0x85}) + "R"}});
  const std::string e = error_of(args_file(inside));
  EXPECT_NE(e.find("global posix.system refused"), std::string::npos) << e;
  EXPECT_NE(e.find(fmt::format("at offset {}", inside.find("cposix"))), std::string::npos) << e;
  // a name with control bytes is printed escaped
  const std::string ctl = error_of(args_file(bytes({0x80, 2}) + "cos\x1b[2J\nx\n."));
  EXPECT_NE(ctl.find("\\x1b"), std::string::npos) << ctl;
}

TEST(TrainingArgs, WrongTypesNaNAndRangesNameTheField) {
  const std::string nan = bytes({'G', 0x7F, 0xF8, 0, 0, 0, 0, 0, 0});
  const std::string inf = bytes({'G', 0x7F, 0xF0, 0, 0, 0, 0, 0, 0});
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>> cases = {
      {{{"per_device_train_batch_size", binunicode("8")}}, "per_device_train_batch_size: expected an integer"},
      {{{"per_device_train_batch_size", bytes({'K', 0})}}, "per_device_train_batch_size: 0 is outside"},
      {{{"per_device_train_batch_size", bytes({0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x40})}}, "outside"},
      {{{"bf16", bytes({'K', 1})}}, "bf16: expected True or False"},
      {{{"learning_rate", nan}}, "learning_rate: nan is not a finite number"},
      {{{"learning_rate", inf}}, "learning_rate: inf is not a finite number"},
      {{{"learning_rate", bytes({'G', 0xBF, 0xF0, 0, 0, 0, 0, 0, 0})}}, "learning_rate: -1 is outside"},
      {{{"optim", bytes({'K', 3})}}, "optim: expected a string or an enum"},
      {{{"dataloader_num_workers", "]"}}, "dataloader_num_workers: expected an integer, got a list"},
      {{{"distributed_state", binunicode("x")}}, "distributed_state: expected accelerate's PartialState"},
  };
  for (const auto& [fields, want] : cases) {
    const std::string m = error_of(args_file(args_pickle(fields)));
    EXPECT_NE(m.find(want), std::string::npos) << "want '" << want << "', got: " << m;
    EXPECT_EQ(m.rfind("ta.bin", 0), 0u) << m;
  }
  // None is an unset field; an int learning rate is a number
  const TrainingArgs a = parse_training_args(
      args_file(args_pickle({{"tf32", "N"}, {"learning_rate", bytes({'K', 1})}, {"warmup_steps", bytes({'K', 5})}})),
      "ta.bin");
  EXPECT_FALSE(a.tf32);
  EXPECT_EQ(a.learning_rate, 1.0);
  EXPECT_EQ(a.warmup_steps, 5.0);
  // not a TrainingArguments: a dict, or an accepted class that is no arguments
  EXPECT_NE(error_of(args_file(bytes({0x80, 2, '}', '.'}))).find("not a TrainingArguments"), std::string::npos);
  EXPECT_NE(error_of(args_file(bytes({0x80, 2}) + "ctorch\ndevice\n" + binunicode("cpu") + bytes({0x85}) + "R."))
                .find("not a TrainingArguments"),
            std::string::npos);
}

// Byte mutations of a real file: each read ends in a result or an error naming the file.
TEST(TrainingArgs, MutationsOfARealFileAreReadOrRefused) {
  const std::string b = read_regular_file(kData + "/transformers-5.25.0/bf16_w4_gc.bin", "t");
  int refused = 0, read = 0;
  for (std::size_t i = 0; i < b.size(); i += 3) {
    std::string m = b;
    m[i] = char(m[i] ^ (1 << (i % 8)));
    try {
      (void)parse_training_args(m, "mut.bin");
      ++read;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("mut.bin", 0), 0u) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_EQ(refused + read, int((b.size() + 2) / 3));
}

}  // namespace
}  // namespace sb
