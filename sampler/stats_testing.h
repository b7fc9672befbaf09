// Test-only statistics: p-values of chi-square and normal (z) statistics, so that statistical
// tests state a family-wise significance level and derive every bound from their sample counts.
#ifndef CARPOOL_SAMPLER_STATS_TESTING_H_
#define CARPOOL_SAMPLER_STATS_TESTING_H_

#include <cmath>
#include <cstdint>
#include <vector>

namespace carpool::testing {

// Regularized upper incomplete gamma Q(a, x) (Numerical Recipes: series below a+1, Lentz's
// continued fraction above).
inline double RegularizedGammaQ(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && std::fabs(term) > std::fabs(sum) * 1e-16; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

// P(X >= x) for X ~ chi-square with `df` degrees of freedom.
inline double ChiSquarePValue(double x, double df) { return RegularizedGammaQ(df / 2, x / 2); }

// Pearson's statistic of `counts` against equal expected counts; df = counts.size() - 1.
inline double PearsonUniform(const std::vector<uint64_t>& counts) {
  double total = 0;
  for (uint64_t c : counts) total += static_cast<double>(c);
  const double expected = total / static_cast<double>(counts.size());
  double x2 = 0;
  for (uint64_t c : counts) x2 += (c - expected) * (c - expected) / expected;
  return x2;
}

// Two-sided p-value of `hits` successes in `trials` Bernoulli(p) draws (normal approximation).
// REQUIRES: 0 < p < 1.
inline double BinomialZPValue(uint64_t hits, uint64_t trials, double p) {
  const double mean = static_cast<double>(trials) * p;
  const double sd = std::sqrt(static_cast<double>(trials) * p * (1 - p));
  return std::erfc(std::fabs(static_cast<double>(hits) - mean) / sd / std::sqrt(2.0));
}

}  // namespace carpool::testing

#endif  // CARPOOL_SAMPLER_STATS_TESTING_H_
