// The roofline's arithmetic (diagnose/trace/roofline.hpp): each op's FLOPs and bytes from its shapes, counted
// by hand here; and on a real H100 trace (AMD's TraceLens test data, read from ../shared/traces-more), the
// op's GPU time found through its launches and its rate held against the H100's datasheet peak.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "diagnose/trace/roofline.hpp"
#include "readers/kineto.hpp"
#include "shared_data.hpp"

namespace sb::diagnose {
namespace {

using readers::ElemType;
using readers::OpShape;

OpShape shape(std::vector<std::vector<std::int64_t>> dims, std::vector<ElemType> types,
              std::vector<std::string> concrete = {}) {
  return {std::move(dims), std::move(types), std::move(concrete)};
}

TEST(Roofline, GemmsCountTwoMnkAndTheirOperandsOnce) {
  const OpWork mm = op_work("aten::mm", shape({{64, 128}, {128, 256}}, {ElemType::bf16, ElemType::bf16}));
  EXPECT_DOUBLE_EQ(mm.flops, 2.0 * 64 * 256 * 128);
  EXPECT_DOUBLE_EQ(mm.bytes, 2.0 * (64 * 128 + 128 * 256 + 64 * 256));
  EXPECT_EQ(mm.dtype, "bf16");
  EXPECT_EQ(mm.category, "gemm");
  // addmm: the bias (a row of N, broadcast) read as well as the output written
  const OpWork add = op_work("aten::addmm", shape({{256}, {64, 128}, {128, 256}, {}, {}},
                                                  {ElemType::f32, ElemType::f32, ElemType::f32}));
  EXPECT_DOUBLE_EQ(add.flops, 2.0 * 64 * 256 * 128);
  EXPECT_DOUBLE_EQ(add.bytes, 4.0 * (64 * 128 + 128 * 256 + 64 * 256 + 256));
  const OpWork bmm = op_work("aten::bmm", shape({{4, 8, 16}, {4, 16, 32}}, {ElemType::f16, ElemType::f16}));
  EXPECT_DOUBLE_EQ(bmm.flops, 2.0 * 4 * 8 * 32 * 16);
  // inner dims that disagree, or a rank that is not a GEMM's: not counted
  EXPECT_EQ(op_work("aten::mm", shape({{64, 128}, {127, 256}}, {})).flops, 0);
  EXPECT_EQ(op_work("aten::bmm", shape({{64, 128}, {128, 256}}, {})).flops, 0);
  EXPECT_EQ(op_work("aten::mm", shape({}, {})).flops, 0);
}

TEST(Roofline, ConvolutionsTakeStridePaddingFromConcreteInputs) {
  // ResNet's stem: 7x7/2, padding 3, 224 -> 112
  const OpWork c = op_work("aten::convolution",
                           shape({{2, 3, 224, 224}, {64, 3, 7, 7}, {}, {}, {}, {}, {}, {}, {}},
                                 {ElemType::f32, ElemType::f32},
                                 {"", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1"}));
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 2 * 64 * 112 * 112 * 3 * 49);
  EXPECT_FALSE(c.assumed);
  EXPECT_DOUBLE_EQ(c.bytes, 4.0 * (2 * 3 * 224 * 224 + 64 * 3 * 49 + 2 * 64 * 112 * 112));
  // without Concrete Inputs (older traces): stride 1, no padding, said so
  const OpWork a = op_work("aten::convolution", shape({{2, 3, 224, 224}, {64, 3, 7, 7}}, {ElemType::f32}));
  EXPECT_DOUBLE_EQ(a.flops, 2.0 * 2 * 64 * 218 * 218 * 3 * 49);
  EXPECT_TRUE(a.assumed);
  // backward: the input and weight gradients, twice the forward, from grad_output's own dims
  const OpWork b = op_work("aten::convolution_backward",
                           shape({{2, 64, 112, 112}, {2, 3, 224, 224}, {64, 3, 7, 7}}, {ElemType::bf16}));
  EXPECT_DOUBLE_EQ(b.flops, 2 * 2.0 * 2 * 64 * 112 * 112 * 3 * 49);
}

TEST(Roofline, AttentionCountsBothGemmsAndHalvesCausal) {
  const OpShape q = shape({{2, 8, 1024, 64}, {2, 8, 1024, 64}, {2, 8, 1024, 64}, {}, {}, {}, {}},
                          {ElemType::bf16, ElemType::bf16, ElemType::bf16},
                          {"", "", "", "0.", "True", "False", "0.125"});
  const OpWork f = op_work("aten::_scaled_dot_product_flash_attention", q);
  EXPECT_DOUBLE_EQ(f.flops, 0.5 * 4.0 * 2 * 8 * 1024 * 1024 * 64);
  EXPECT_FALSE(f.assumed);
  OpShape nc = q;
  nc.concrete[4] = "False";
  EXPECT_DOUBLE_EQ(op_work("aten::_scaled_dot_product_flash_attention", nc).flops, 4.0 * 2 * 8 * 1024 * 1024 * 64);
  // the backward (grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal):
  // 2.5x the forward, halved when causal as the forward is
  OpShape b = shape({{2, 8, 1024, 64}, {2, 8, 1024, 64}, {2, 8, 1024, 64}, {2, 8, 1024, 64}},
                    {ElemType::bf16, ElemType::bf16, ElemType::bf16, ElemType::bf16},
                    {"", "", "", "", "", "", "", "", "", "", "0.", "True"});
  const OpWork bw = op_work("aten::_scaled_dot_product_flash_attention_backward", b);
  EXPECT_DOUBLE_EQ(bw.flops, 2.5 * 0.5 * 4.0 * 2 * 8 * 1024 * 1024 * 64);
  EXPECT_FALSE(bw.assumed);
}

TEST(Roofline, RealH100TraceGemmsAgainstTheDatasheet) {
  const std::string f = test::shared_data("traces-more/AMD-AGI__TraceLens__h100_qwen05b_infer.pt.trace.json.gz");
  SB_NEED_SHARED_DATA(f);
  const readers::Trace t = readers::read_kineto(f);
  ASSERT_FALSE(t.shapes.empty());
  const auto card = expected_for_trace(t);
  ASSERT_TRUE(card.is_object()) << "results/expected has the H100 SXM (its name_contains 'H100 80GB HBM3')";
  const Roofline r = roofline(t, card);
  const RooflineRow* mlp = nullptr;
  for (const auto& x : r.rows)
    if (x.op == "aten::mm" && x.shapes == "[8944,1024] [1024,2816]") mlp = &x;
  ASSERT_NE(mlp, nullptr);
  EXPECT_EQ(mlp->calls, 48);
  EXPECT_DOUBLE_EQ(mlp->flops, 48 * 2.0 * 8944 * 2816 * 1024);
  EXPECT_EQ(mlp->dtype, "bf16");
  EXPECT_DOUBLE_EQ(mlp->peak_tflops, 989.4);
  EXPECT_EQ(mlp->bound, "compute");
  // the MLP's GEMMs on an H100 at bf16: well under the peak, well over a tenth of it
  EXPECT_GT(mlp->tflops, 300);
  EXPECT_LT(mlp->tflops, 989.4);
  EXPECT_GT(r.counted_gpu_us, 0.2 * r.kernel_us);
  EXPECT_LT(r.counted_gpu_us, r.kernel_us);
}

}  // namespace
}  // namespace sb::diagnose
