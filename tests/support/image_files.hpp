// Image files written in memory for tests (libpng's simplified writer, libjpeg) and base64
// for data URLs. Link PNG::PNG and JPEG::JPEG.
#pragma once

#include <doctest/doctest.h>
#include <png.h>

#include <cstdio>
#include <jpeglib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace shoal::test {

using bytes = std::vector<uint8_t>;

// A PNG of `pixels` in a simplified-API format (PNG_FORMAT_RGB, _RGBA, _GRAY, _RGB_COLORMAP).
inline bytes write_png(const void* pixels, int w, int h, uint32_t format, const bytes& colormap = {}) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = format;
  img.colormap_entries = static_cast<png_uint_32>(colormap.size() / 3);
  const void* cmap = colormap.empty() ? nullptr : colormap.data();
  png_alloc_size_t size = 0;
  REQUIRE(png_image_write_get_memory_size(img, size, 0, pixels, 0, cmap));
  bytes out(size);
  REQUIRE(png_image_write_to_memory(&img, out.data(), &size, 0, pixels, 0, cmap));
  out.resize(size);
  return out;
}

// A JPEG of (h, w, components) pixels at `quality`.
inline bytes write_jpeg(const bytes& pixels, int w, int h, int components, int quality, bool progressive) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = components;
  c.in_color_space = components == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  if (progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) + size_t{c.next_scanline} * static_cast<size_t>(w * components);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  bytes out(buf, buf + size);
  std::free(buf);
  jpeg_destroy_compress(&c);
  return out;
}

// Standard base64 with padding.
inline std::string base64(const bytes& b) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t v = (uint32_t{b[i]} << 16) | (i + 1 < b.size() ? uint32_t{b[i + 1]} << 8 : 0) |
                       (i + 2 < b.size() ? uint32_t{b[i + 2]} : 0);
    s += abc[v >> 18];
    s += abc[(v >> 12) & 63];
    s += i + 1 < b.size() ? abc[(v >> 6) & 63] : '=';
    s += i + 2 < b.size() ? abc[v & 63] : '=';
  }
  return s;
}

}  // namespace shoal::test
