#include "server/area_resize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace carpool {
namespace {

// One source pixel's share of an output pixel along one axis.
struct AreaWeight {
  int source = 0;  // source column (x) or row (y)
  float alpha = 0;
};

// OpenCV's scale for a size given as dsize: 1 / (dsize / ssize), in double (not ssize / dsize,
// which can differ in the last bit).
double AreaScale(int source, int resized) { return 1. / (static_cast<double>(resized) / source); }

// The weights of every output pixel along one axis, in OpenCV's order (computeResizeAreaTab), and
// where each output pixel's run starts (`starts`, size + 1 entries).
void AreaWeights(int source, int resized, std::vector<AreaWeight>* weights,
                 std::vector<int>* starts) {
  const double scale = AreaScale(source, resized);
  weights->clear();
  starts->assign(static_cast<size_t>(resized) + 1, 0);
  for (int d = 0; d < resized; ++d) {
    (*starts)[d] = static_cast<int>(weights->size());
    const double f1 = d * scale;
    const double f2 = f1 + scale;
    const double cell = std::min(scale, source - f1);
    int s1 = static_cast<int>(std::ceil(f1));
    int s2 = static_cast<int>(std::floor(f2));
    s2 = std::min(s2, source - 1);
    s1 = std::min(s1, s2);
    if (s1 - f1 > 1e-3) weights->push_back({s1 - 1, static_cast<float>((s1 - f1) / cell)});
    for (int s = s1; s < s2; ++s) weights->push_back({s, static_cast<float>(1.0 / cell)});
    if (f2 - s2 > 1e-3) {
      weights->push_back({s2, static_cast<float>(std::min(std::min(f2 - s2, 1.), cell) / cell)});
    }
  }
  (*starts)[resized] = static_cast<int>(weights->size());
}

// OpenCV's saturate_cast<uchar>(float) over a row: round half to even (the default rounding
// mode, as cvRound), clamp to 0..255.
void RoundRow(const float* __restrict sum, size_t n, uint8_t* __restrict out) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm_cvtps_epi32(_mm_loadu_ps(sum + i));
    const __m128i b = _mm_cvtps_epi32(_mm_loadu_ps(sum + i + 4));
    const __m128i c = _mm_cvtps_epi32(_mm_loadu_ps(sum + i + 8));
    const __m128i d = _mm_cvtps_epi32(_mm_loadu_ps(sum + i + 12));
    const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bytes);
  }
#endif
  for (; i < n; ++i) {
    const long r = std::lrintf(sum[i]);
    out[i] = static_cast<uint8_t>(r < 0 ? 0 : r > 255 ? 255 : r);
  }
}

// OpenCV's vertical step: sum = beta * buf for an output row's first source row, then
// sum = sum + beta * buf, each product and sum rounded to float.
void VerticalStep(bool first, float beta, const float* __restrict buf, size_t n,
                  float* __restrict sum) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 b = _mm_set1_ps(beta);
  if (first) {
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(sum + i, _mm_mul_ps(b, _mm_loadu_ps(buf + i)));
  } else {
    for (; i + 4 <= n; i += 4) {
      _mm_storeu_ps(sum + i,
                    _mm_add_ps(_mm_loadu_ps(sum + i), _mm_mul_ps(b, _mm_loadu_ps(buf + i))));
    }
  }
#endif
  for (; i < n; ++i) sum[i] = first ? beta * buf[i] : sum[i] + beta * buf[i];
}

// The window's columns as flat runs: for output column ox, entries [start[ox], start[ox + 1]) of
// `offset` (the source pixel's first byte in a row) and `alpha`, in OpenCV's order. Columns from
// `wide_end` on read a pixel within 4 bytes of the row's end.
struct ColumnRuns {
  std::vector<int> start, offset;
  std::vector<float> alpha;
  int wide_end = 0;
};

ColumnRuns WindowColumns(const std::vector<AreaWeight>& xw, const std::vector<int>& xstart, int x0,
                         int width, int channels, int src_width) {
  ColumnRuns runs;
  runs.start.reserve(static_cast<size_t>(width) + 1);
  runs.wide_end = width;
  const int row_bytes = src_width * channels;
  for (int ox = 0; ox < width; ++ox) {
    runs.start.push_back(static_cast<int>(runs.offset.size()));
    for (int k = xstart[x0 + ox]; k < xstart[x0 + ox + 1]; ++k) {
      const int offset = xw[k].source * channels;
      if (offset + 4 > row_bytes) runs.wide_end = std::min(runs.wide_end, ox);
      runs.offset.push_back(offset);
      runs.alpha.push_back(xw[k].alpha);
    }
  }
  runs.start.push_back(static_cast<int>(runs.offset.size()));
  return runs;
}

#if defined(__SSE2__)
// The 4 bytes at p as floats.
inline __m128 FourBytes(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  const __m128i zero = _mm_setzero_si128();
  const __m128i x = _mm_unpacklo_epi8(_mm_cvtsi32_si128(v), zero);
  return _mm_cvtepi32_ps(_mm_unpacklo_epi16(x, zero));
}
#endif

// The horizontal pass of one source row over the window's columns: per output column and channel,
// the products source * alpha summed in the runs' order from 0, as OpenCV's buf[] holds them.
// `out` has room for 4 floats past the row (the wide path writes a pixel's 4th lane there).
void HorizontalPass(const uint8_t* __restrict row, const ColumnRuns& runs, int width, int channels,
                    float* __restrict out) {
  const int* start = runs.start.data();
  const int* offset = runs.offset.data();
  const float* alpha = runs.alpha.data();
  int ox = 0;
#if defined(__SSE2__)
  if (channels >= 3) {  // one pixel per vector; lanes past `channels` are overwritten or unused
    for (; ox < runs.wide_end; ++ox) {
      __m128 acc = _mm_setzero_ps();
      for (int k = start[ox]; k < start[ox + 1]; ++k) {
        acc = _mm_add_ps(acc, _mm_mul_ps(FourBytes(row + offset[k]), _mm_set1_ps(alpha[k])));
      }
      _mm_storeu_ps(out + static_cast<size_t>(ox) * channels, acc);
    }
  }
#endif
  for (; ox < width; ++ox) {
    float acc[4] = {0, 0, 0, 0};
    for (int k = start[ox]; k < start[ox + 1]; ++k) {
      for (int c = 0; c < channels; ++c) acc[c] = acc[c] + row[offset[k] + c] * alpha[k];
    }
    for (int c = 0; c < channels; ++c) out[ox * channels + c] = acc[c];
  }
}

}  // namespace

bool AreaResizeApplies(const ResizeCropGeometry& g, int channels) {
  if (channels < 1 || channels > 4) return false;
  if (g.src_width <= 0 || g.src_height <= 0 || g.resized_width <= 0 || g.resized_height <= 0) {
    return false;
  }
  if (g.crop_x < 0 || g.crop_y < 0 || g.out_width <= 0 || g.out_height <= 0 ||
      g.crop_x + g.out_width > g.resized_width || g.crop_y + g.out_height > g.resized_height) {
    return false;
  }
  if (g.src_width == g.resized_width && g.src_height == g.resized_height) return false;  // a copy
  const double scale_x = AreaScale(g.src_width, g.resized_width);
  const double scale_y = AreaScale(g.src_height, g.resized_height);
  // Below 1 either way OpenCV emulates area with bilinear weights.
  if (!(scale_x >= 1 && scale_y >= 1)) return false;
  const int ix = static_cast<int>(std::lrint(scale_x)), iy = static_cast<int>(std::lrint(scale_y));
  const bool integer_factor =
      std::abs(scale_x - ix) < DBL_EPSILON && std::abs(scale_y - iy) < DBL_EPSILON;
  return !integer_factor;
}

namespace {

// The weights of one geometry, kept per thread: a dataset's samples mostly share one geometry,
// and building them cost about 12 us of a 360 us resize (500x375 -> 341x256 -> 256).
struct AreaTables {
  int src_width = -1, src_height = -1, resized_width = -1, resized_height = -1;
  int crop_x = -1, out_width = -1, channels = -1;
  std::vector<AreaWeight> xw, yw;
  std::vector<int> xstart, ystart;
  ColumnRuns runs;
};

const AreaTables& TablesFor(const ResizeCropGeometry& g, int channels) {
  thread_local AreaTables t;
  if (t.src_width != g.src_width || t.src_height != g.src_height ||
      t.resized_width != g.resized_width || t.resized_height != g.resized_height ||
      t.crop_x != g.crop_x || t.out_width != g.out_width || t.channels != channels) {
    AreaWeights(g.src_width, g.resized_width, &t.xw, &t.xstart);
    AreaWeights(g.src_height, g.resized_height, &t.yw, &t.ystart);
    t.runs = WindowColumns(t.xw, t.xstart, g.crop_x, g.out_width, channels, g.src_width);
    t.src_width = g.src_width;
    t.src_height = g.src_height;
    t.resized_width = g.resized_width;
    t.resized_height = g.resized_height;
    t.crop_x = g.crop_x;
    t.out_width = g.out_width;
    t.channels = channels;
  }
  return t;
}

}  // namespace

void AreaResizeCrop(const ResizeCropGeometry& g, const uint8_t* src, size_t pitch, int channels,
                    uint8_t* dst) {
  const AreaTables& tables = TablesFor(g, channels);
  const std::vector<AreaWeight>& yw = tables.yw;
  const std::vector<int>& ystart = tables.ystart;
  const ColumnRuns& runs = tables.runs;
  const size_t row_floats = static_cast<size_t>(g.out_width) * channels;
  // The last source row's horizontal pass (`cached`, reused when the next output row starts on that
  // row, as it usually does), the one being computed (`fresh`), and the output row's sum.
  const size_t stride = row_floats + 4;  // HorizontalPass may write a lane past the row
  std::vector<float> scratch(stride * 3);
  float* cached = scratch.data();
  float* fresh = cached + stride;
  float* __restrict sum = fresh + stride;
  int cached_row = -1;
  for (int oy = 0; oy < g.out_height; ++oy) {
    const int y = g.crop_y + oy;
    for (int k = ystart[y]; k < ystart[y + 1]; ++k) {
      const int sy = yw[k].source;
      if (sy != cached_row) {
        HorizontalPass(src + static_cast<size_t>(sy) * pitch, runs, g.out_width, channels, fresh);
        std::swap(cached, fresh);
        cached_row = sy;
      }
      VerticalStep(k == ystart[y], yw[k].alpha, cached, row_floats, sum);
    }
    RoundRow(sum, row_floats, dst + static_cast<size_t>(oy) * row_floats);
  }
}

}  // namespace carpool
