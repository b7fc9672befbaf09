// The CPU preparation's shrink, byte for byte what OpenCV's INTER_AREA gives at a non-integer
// scale (imgproc's computeResizeAreaTab and ResizeArea_Invoker: float weights from double
// cell edges, products and sums in float in the same order, round half to even), but computed
// for the crop window only and with each source row's horizontal pass done once instead of once
// per output row it touches. area_resize_test.cc compares it with cv::resize + crop.
//
// This file is compiled with -ffp-contract=off: a fused multiply-add would round once where
// OpenCV rounds twice, and the bytes would drift from cv::resize's.
#ifndef CARPOOL_SERVER_AREA_RESIZE_H_
#define CARPOOL_SERVER_AREA_RESIZE_H_

#include <cstddef>
#include <cstdint>

#include "server/exact_resize.h"

namespace carpool {

// True when cv::resize(INTER_AREA) from src_* to resized_* takes OpenCV's general area path:
// shrinking in both directions (scale >= 1 each way) and not an integer factor in both (that is
// resizeAreaFast_, other arithmetic), and a window inside the resized image. Otherwise the
// caller uses cv::resize itself. O(1).
bool AreaResizeApplies(const ResizeCropGeometry& g, int channels);

// Writes the out_* window of the resized image to dst (out_height rows of out_width x channels
// bytes, packed). REQUIRES: AreaResizeApplies(g, channels). Cost: O(window pixels x the source
// pixels each covers + source rows x window width); scratch: three window rows of floats and the
// weights of every source column and row.
void AreaResizeCrop(const ResizeCropGeometry& g, const uint8_t* src, size_t pitch, int channels,
                    uint8_t* dst);

}  // namespace carpool

#endif  // CARPOOL_SERVER_AREA_RESIZE_H_
