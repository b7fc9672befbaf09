#include "server/exact_resize.h"

namespace carpool {

void ExactResizeCrop(const ResizeCropGeometry& g, const uint8_t* src, size_t pitch, int channels,
                     uint8_t* dst) {
  for (int oy = 0; oy < g.out_height; ++oy) {
    for (int ox = 0; ox < g.out_width; ++ox) {
      ExactResizePixel(g, src, pitch, channels, ox, oy,
                       dst + (static_cast<size_t>(oy) * g.out_width + ox) * channels);
    }
  }
}

}  // namespace carpool
