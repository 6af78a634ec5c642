// kiln/loss.hpp: what the trainer minimises, and what its evaluation reports.
//
// The loss is a component of the trainer, not of its type: trainer_options::loss holds any
// loss kind, defaulting to cross-entropy (classification). kiln's kinds are in kiln::losses:
//   cross_entropy   class logits [N, C] (or [..., C]) vs class indices; accuracy
//   next_token      language modelling: the same mean over tokens (not sequences), with
//                   perplexity and bits per token
//   mse, l1         regression: outputs vs float targets of the same shape; each reports the other
// A loss of your own is a struct with
//   static constexpr std::string_view kind;                 its name ([loss] kind in a recipe)
//   template <class V> void describe(V&);                   its settings (may list none)
//   torch::Tensor loss(const torch::Tensor& outputs, const torch::Tensor& targets) const;
//                                                           the mean over the batch's items
// and optionally
//   double items(const torch::Tensor& targets) const;       how many items that mean is over (for
//                                                           gradient accumulation and evaluation; default: samples)
//   std::vector<kiln::metric> metrics() const;              what evaluation reports besides the loss
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/errors.hpp"
#include "kiln/models/cross_entropy.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln {

// Targets other than this (LibTorch's default) are scored by the classification losses.
inline constexpr std::int64_t ignore_index = -100;

// A number evaluation reports: `sum` adds up a batch's contribution (over the loss's items;
// empty: none, the value comes from the loss alone), and `value` turns the mean of those sums
// over all items, and the mean loss, into the number shown.
struct metric {
  std::string name;
  std::function<torch::Tensor(const torch::Tensor& outputs, const torch::Tensor& targets)> sum;
  std::function<double(double mean, double loss)> value = [](double mean, double) { return mean; };
  bool percent = false;  // shown as a percentage (accuracy)
};

template <class L>
concept loss_kind = requires(const L& l, const torch::Tensor& t) {
  { L::kind } -> std::convertible_to<std::string_view>;
  { l.loss(t, t) } -> std::convertible_to<torch::Tensor>;
};

// Any loss kind, held by value, so that one trainer type trains every task.
class loss_function {
 public:
  template <loss_kind L>
  loss_function(L loss)  // NOLINT(google-explicit-constructor): trainer_options{.loss = kiln::losses::mse{}}
      : self_(std::make_shared<const holder<L>>(std::move(loss))) {}

  std::string_view kind() const { return self_->kind(); }

  // The mean over the batch's items.
  torch::Tensor operator()(const torch::Tensor& outputs, const torch::Tensor& targets) const {
    return self_->loss(outputs, targets);
  }
  double items(const torch::Tensor& targets) const { return self_->items(targets); }
  const std::vector<metric>& metrics() const { return self_->metrics; }

 private:
  struct base {
    virtual ~base() = default;
    virtual std::string_view kind() const = 0;
    virtual torch::Tensor loss(const torch::Tensor&, const torch::Tensor&) const = 0;
    virtual double items(const torch::Tensor&) const = 0;
    std::vector<metric> metrics;
  };
  template <class L>
  struct holder final : base {
    explicit holder(L l) : value(std::move(l)) {
      if constexpr (requires { value.metrics(); }) this->metrics = value.metrics();
    }
    std::string_view kind() const override { return L::kind; }
    torch::Tensor loss(const torch::Tensor& o, const torch::Tensor& t) const override { return value.loss(o, t); }
    double items(const torch::Tensor& t) const override {
      if constexpr (requires { value.items(t); }) return value.items(t);
      else return static_cast<double>(t.size(0));
    }
    L value;
  };
  std::shared_ptr<const base> self_;
};

namespace losses {

namespace detail {
inline double scored_targets(const torch::Tensor& targets) { return targets.ne(ignore_index).sum().item<double>(); }

inline metric accuracy() {
  return {"accuracy",
          [](const torch::Tensor& logits, const torch::Tensor& targets) {
            return logits.argmax(-1).eq(targets).logical_and(targets.ne(ignore_index)).sum();
          },
          [](double mean, double) { return mean; }, true};
}
}  // namespace detail

// Mean cross-entropy over the targets other than ignore_index, in fp32 whatever the logits'
// dtype, keeping for backward only the logits and a number per row (models/cross_entropy.hpp).
struct cross_entropy {
  static constexpr std::string_view kind = "cross-entropy";
  template <class V>
  void describe(V&) {}
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
    return models::cross_entropy(logits, targets, ignore_index);
  }
  double items(const torch::Tensor& targets) const { return detail::scored_targets(targets); }
  std::vector<metric> metrics() const { return {detail::accuracy()}; }
};

// Next-token prediction: cross-entropy per token (padding skipped), so that a batch's long and
// short sequences weigh by their tokens; evaluation adds perplexity, exp(loss), and bits per
// token, loss / ln 2 (bits per byte for byte tokens, as `[data] kind = "text"` has).
struct next_token {
  static constexpr std::string_view kind = "next-token";
  template <class V>
  void describe(V&) {}
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
    return models::cross_entropy(logits, targets, ignore_index);
  }
  double items(const torch::Tensor& targets) const { return detail::scored_targets(targets); }
  std::vector<metric> metrics() const {
    return {detail::accuracy(), {"perplexity", {}, [](double, double loss) { return std::exp(loss); }},
            {"bits_per_token", {}, [](double, double loss) { return loss / std::log(2.0); }}};
  }
};

namespace detail {
inline void require_same_shape(std::string_view kind, const torch::Tensor& outputs, const torch::Tensor& targets) {
  if (outputs.sizes() != targets.sizes() || !targets.is_floating_point())
    throw config_error(std::string(kind) + " loss: the model's outputs " + std::string(c10::str(outputs.sizes())) +
                       " and the targets " + std::string(c10::str(targets.sizes())) + " (" +
                       std::string(c10::toString(targets.scalar_type())) +
                       ") must be float tensors of one shape; is the [loss] kind the one for this data?");
}
}  // namespace detail

// Regression: mean squared error over every target value; evaluation adds the mean absolute error.
struct mse {
  static constexpr std::string_view kind = "mse";
  template <class V>
  void describe(V&) {}
  torch::Tensor loss(const torch::Tensor& outputs, const torch::Tensor& targets) const {
    detail::require_same_shape(kind, outputs, targets);
    return torch::mse_loss(outputs.to(torch::kFloat32), targets.to(torch::kFloat32));
  }
  double items(const torch::Tensor& targets) const { return static_cast<double>(targets.numel()); }
  std::vector<metric> metrics() const {
    return {{"mae", [](const torch::Tensor& o, const torch::Tensor& t) { return (o - t).abs().sum(); }},
            {"rmse", {}, [](double, double loss) { return std::sqrt(loss); }}};
  }
};

// Regression: mean absolute error; evaluation adds the mean squared error.
struct l1 {
  static constexpr std::string_view kind = "l1";
  template <class V>
  void describe(V&) {}
  torch::Tensor loss(const torch::Tensor& outputs, const torch::Tensor& targets) const {
    detail::require_same_shape(kind, outputs, targets);
    return torch::l1_loss(outputs.to(torch::kFloat32), targets.to(torch::kFloat32));
  }
  double items(const torch::Tensor& targets) const { return static_cast<double>(targets.numel()); }
  std::vector<metric> metrics() const {
    return {{"mse", [](const torch::Tensor& o, const torch::Tensor& t) { return (o - t).pow(2).sum(); }}};
  }
};

}  // namespace losses

}  // namespace kiln
