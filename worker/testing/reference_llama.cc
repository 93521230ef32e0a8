#include "worker/testing/reference_llama.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/gguf/ggml_types.h"
#include "common/status_macros.h"

namespace tandem::worker::testing {

absl::StatusOr<ReferenceLlama::Matrix> ReferenceLlama::LoadMatrix(const gguf::GgufFile& file,
                                                                  const std::string& name) {
  const gguf::GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor ", name));
  Matrix m;
  m.cols = t->shape[0];
  m.rows = t->shape[1];
  m.data.resize(m.rows * m.cols);
  TANDEM_RETURN_IF_ERROR(gguf::DequantizeRow(t->type, t->data, m.data.data(), m.rows * m.cols));
  return m;
}

absl::StatusOr<std::vector<float>> ReferenceLlama::LoadVector(const gguf::GgufFile& file, const std::string& name) {
  const gguf::GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor ", name));
  std::vector<float> v(t->num_elements);
  TANDEM_RETURN_IF_ERROR(gguf::DequantizeRow(t->type, t->data, v.data(), t->num_elements));
  return v;
}

absl::StatusOr<ReferenceLlama> ReferenceLlama::Load(const gguf::GgufFile& file) {
  ReferenceLlama model;
  TANDEM_ASSIGN_OR_RETURN(model.config_, gguf::ReadLlamaConfig(file));
  TANDEM_ASSIGN_OR_RETURN(model.embedding_, LoadMatrix(file, "token_embd.weight"));
  TANDEM_ASSIGN_OR_RETURN(model.output_norm_, LoadVector(file, "output_norm.weight"));
  if (!model.config_.tied_embeddings) {
    TANDEM_ASSIGN_OR_RETURN(model.output_, LoadMatrix(file, "output.weight"));
  }
  for (int32_t i = 0; i < model.config_.num_layers; ++i) {
    Layer layer;
    const std::string p = absl::StrCat("blk.", i, ".");
    TANDEM_ASSIGN_OR_RETURN(layer.attn_norm, LoadVector(file, p + "attn_norm.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.ffn_norm, LoadVector(file, p + "ffn_norm.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.wq, LoadMatrix(file, p + "attn_q.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.wk, LoadMatrix(file, p + "attn_k.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.wv, LoadMatrix(file, p + "attn_v.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.wo, LoadMatrix(file, p + "attn_output.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.gate, LoadMatrix(file, p + "ffn_gate.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.up, LoadMatrix(file, p + "ffn_up.weight"));
    TANDEM_ASSIGN_OR_RETURN(layer.down, LoadMatrix(file, p + "ffn_down.weight"));
    model.layers_.push_back(std::move(layer));
  }
  return model;
}

std::vector<float> ReferenceLlama::MatVec(const Matrix& m, const std::vector<float>& x) {
  std::vector<float> y(m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < m.cols; ++c) sum += static_cast<double>(m.data[r * m.cols + c]) * x[c];
    y[r] = static_cast<float>(sum);
  }
  return y;
}

std::vector<float> ReferenceLlama::RmsNorm(const std::vector<float>& x, const std::vector<float>& w) const {
  double sum = 0;
  for (float v : x) sum += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(sum / x.size() + config_.rms_norm_eps);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i] * scale * w[i]);
  return out;
}

void ReferenceLlama::Rope(std::vector<float>& v, int32_t heads, int32_t position) const {
  const int32_t d = config_.head_dim;
  const double scale = config_.rope_scaling == gguf::RopeScaling::kLinear ? 1.0 / config_.rope_scaling_factor : 1.0;
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t i = 0; i < config_.rope_dim / 2; ++i) {
      const double theta = position * scale * std::pow(config_.rope_freq_base, -2.0 * i / config_.rope_dim);
      float& a = v[h * d + 2 * i];
      float& b = v[h * d + 2 * i + 1];
      const double x = a, y = b;
      a = static_cast<float>(x * std::cos(theta) - y * std::sin(theta));
      b = static_cast<float>(x * std::sin(theta) + y * std::cos(theta));
    }
  }
}

std::vector<std::vector<float>> ReferenceLlama::Logits(absl::Span<const TokenId> tokens, bool half_kv) const {
  const gguf::LlamaConfig& c = config_;
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t d = c.head_dim;
  std::vector<std::vector<float>> x(n);
  for (int32_t t = 0; t < n; ++t) {
    x[t].assign(embedding_.data.begin() + tokens[t] * embedding_.cols,
                embedding_.data.begin() + (tokens[t] + 1) * embedding_.cols);
  }
  for (const Layer& layer : layers_) {
    std::vector<std::vector<float>> q(n), k(n), v(n);
    for (int32_t t = 0; t < n; ++t) {
      const std::vector<float> h = RmsNorm(x[t], layer.attn_norm);
      q[t] = MatVec(layer.wq, h);
      k[t] = MatVec(layer.wk, h);
      v[t] = MatVec(layer.wv, h);
      Rope(q[t], c.num_heads, t);
      Rope(k[t], c.num_kv_heads, t);
      if (half_kv) {
        for (float& f : k[t]) f = gguf::HalfToFloat(gguf::FloatToHalf(f));
        for (float& f : v[t]) f = gguf::HalfToFloat(gguf::FloatToHalf(f));
      }
    }
    for (int32_t t = 0; t < n; ++t) {
      std::vector<float> attn(c.num_heads * d, 0.0f);
      for (int32_t h = 0; h < c.num_heads; ++h) {
        const int32_t kv = h / (c.num_heads / c.num_kv_heads);
        std::vector<double> scores(t + 1);
        double max = -1e300;
        for (int32_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int32_t i = 0; i < d; ++i) s += static_cast<double>(q[t][h * d + i]) * k[j][kv * d + i];
          scores[j] = s / std::sqrt(static_cast<double>(d));
          max = std::max(max, scores[j]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - max));
        for (int32_t i = 0; i < d; ++i) {
          double acc = 0;
          for (int32_t j = 0; j <= t; ++j) acc += scores[j] * v[j][kv * d + i];
          attn[h * d + i] = static_cast<float>(acc / total);
        }
      }
      const std::vector<float> o = MatVec(layer.wo, attn);
      for (size_t i = 0; i < o.size(); ++i) x[t][i] += o[i];
    }
    for (int32_t t = 0; t < n; ++t) {
      const std::vector<float> h = RmsNorm(x[t], layer.ffn_norm);
      std::vector<float> g = MatVec(layer.gate, h);
      const std::vector<float> u = MatVec(layer.up, h);
      for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(g[i] / (1.0 + std::exp(-g[i])) * u[i]);
      const std::vector<float> down = MatVec(layer.down, g);
      for (size_t i = 0; i < down.size(); ++i) x[t][i] += down[i];
    }
  }
  const Matrix& head = c.tied_embeddings ? embedding_ : output_;
  std::vector<std::vector<float>> logits(n);
  for (int32_t t = 0; t < n; ++t) logits[t] = MatVec(head, RmsNorm(x[t], output_norm_));
  return logits;
}

}  // namespace tandem::worker::testing
