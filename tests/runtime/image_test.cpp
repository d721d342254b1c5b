// Tests of runtime/image: PNGs (libpng's simplified writer, and hand-built chunks for 16-bit
// and forged headers) and JPEGs (libjpeg) written in memory and decoded back to exact or
// bounded pixels; a table of bad data URLs, each with its errc and message; truncated, foreign
// and forged inputs; resize_area and fit_to_patches against hand-computed values; and a
// seeded fuzz of mutated files that must each decode consistently or fail with a message.
#include "runtime/vision/image.hpp"

#include <doctest/doctest.h>

#include "tests/support/image_files.hpp"
#include <png.h>
#include <xxhash.h>
#include <zlib.h>

#include <cstdio>
#include <jpeglib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace shoal::runtime;
using bytes = std::vector<uint8_t>;
using shoal::test::base64;
using shoal::test::write_jpeg;
using shoal::test::write_png;

namespace {

// --- writers -----------------------------------------------------------------------------

void put_be32(bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

uint32_t get_be32(const bytes& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

void add_chunk(bytes& png, const char* type, const bytes& data) {
  put_be32(png, static_cast<uint32_t>(data.size()));
  const size_t from = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  put_be32(png, static_cast<uint32_t>(crc32(0, png.data() + from, static_cast<uInt>(png.size() - from))));
}

// A PNG built chunk by chunk: `raw` are the scanlines, each led by filter byte 0.
bytes craft_png(uint32_t w, uint32_t h, uint8_t depth, uint8_t color_type, const bytes& raw) {
  bytes png{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  bytes ihdr;
  put_be32(ihdr, w);
  put_be32(ihdr, h);
  ihdr.insert(ihdr.end(), {depth, color_type, 0, 0, 0});
  add_chunk(png, "IHDR", ihdr);
  uLongf zsize = compressBound(static_cast<uLong>(raw.size()));
  bytes z(zsize);
  REQUIRE(compress(z.data(), &zsize, raw.data(), static_cast<uLong>(raw.size())) == Z_OK);
  z.resize(zsize);
  add_chunk(png, "IDAT", z);
  add_chunk(png, "IEND", {});
  return png;
}

// Recomputes every complete chunk's CRC, so a mutation reaches the checks behind the CRC.
void fix_png_crcs(bytes& png) {
  size_t at = 8;
  while (at + 12 <= png.size()) {
    const uint32_t len = get_be32(png, at);
    if (len > png.size() - at - 12) return;
    const uint32_t crc = static_cast<uint32_t>(crc32(0, png.data() + at + 4, len + 4));
    for (int i = 0; i < 4; ++i) png[at + 8 + len + static_cast<size_t>(i)] = static_cast<uint8_t>(crc >> (24 - 8 * i));
    at += 12 + len;
  }
}

// A smooth gradient, (h, w, 3).
bytes gradient(int w, int h) {
  bytes px;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      px.insert(px.end(), {static_cast<uint8_t>(x * 255 / std::max(w - 1, 1)),
                           static_cast<uint8_t>(y * 255 / std::max(h - 1, 1)),
                           static_cast<uint8_t>((x + y) * 127 / std::max(w + h - 2, 1))});
  return px;
}

// Distinct, irregular pixels, (h, w, 3): a lossless round trip must reproduce each one.
bytes pattern(int w, int h) {
  bytes px;
  for (int i = 0; i < w * h * 3; ++i) px.push_back(static_cast<uint8_t>((i * 37 + i / 7 * 11) % 256));
  return px;
}

rgb_image decode_ok(const bytes& file, const image_limits& limits = {}) {
  auto r = decode_image(file, limits);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().message));
  CHECK(r->rgb.size() == static_cast<size_t>(r->width * r->height * 3));
  return std::move(*r);
}

void check_error(const std::expected<rgb_image, image_error>& r, image_errc code, const std::string& part) {
  REQUIRE(!r.has_value());
  CAPTURE(r.error().message);
  CHECK(image_errc_name(r.error().code) == std::string(image_errc_name(code)));
  CHECK(r.error().message.find(part) != std::string::npos);
}

// One random mutation of a valid PNG or JPEG file.
void mutate(bytes& f, bool is_png, std::mt19937& rng) {
  const auto below = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  switch (rng() % 6) {
    case 0: f.resize(below(f.size())); break;  // truncated anywhere
    case 1:  // bit flips anywhere
      for (size_t k = 0, n = 1 + below(8); k < n; ++k) f[below(f.size())] ^= static_cast<uint8_t>(1u << below(8));
      break;
    case 2:  // random bytes over the header region
      for (size_t k = 0, n = 1 + below(4); k < n; ++k) f[below(std::min<size_t>(f.size(), 64))] = static_cast<uint8_t>(rng());
      break;
    case 3: {  // another format's magic
      const bytes magic = is_png ? bytes{0xff, 0xd8, 0xff} : bytes{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
      std::copy(magic.begin(), magic.end(), f.begin());
      break;
    }
    case 4:  // a random width or height byte (PNG IHDR, CRC fixed; JPEG SOF0)
      if (is_png) {
        f[16 + below(8)] = static_cast<uint8_t>(rng());
        fix_png_crcs(f);
      } else {
        size_t sof = 2;
        while (sof + 9 < f.size() && !(f[sof] == 0xff && f[sof + 1] == 0xc0)) ++sof;
        if (sof + 9 < f.size()) f[sof + 5 + below(4)] = static_cast<uint8_t>(rng());
      }
      break;
    default:  // PNG: flips behind fixed CRCs, reaching IHDR and zlib checks; JPEG: flips in the headers
      for (size_t k = 0, n = 1 + below(3); k < n; ++k) {
        f[8 + below(is_png ? f.size() - 8 : std::min<size_t>(f.size() - 8, 600))] ^= static_cast<uint8_t>(1u << below(8));
      }
      if (is_png) fix_png_crcs(f);
  }
}

rgb_image make_image(int64_t w, int64_t h, bytes rgb) {
  rgb_image img;
  img.width = w;
  img.height = h;
  img.rgb = std::move(rgb);
  return img;
}

}  // namespace

TEST_CASE("image: PNG RGB, RGBA, grey, palette and 16-bit decode to exact RGB") {
  SUBCASE("RGB") {
    const bytes px = pattern(7, 5);
    const bytes png = write_png(px.data(), 7, 5, PNG_FORMAT_RGB);
    CHECK(png[25] == 2);  // IHDR colour type: truecolour
    const rgb_image img = decode_ok(png);
    CHECK(img.width == 7);
    CHECK(img.height == 5);
    CHECK(img.rgb == px);
  }
  SUBCASE("RGBA: opaque pixels exact, transparent ones black, half-transparent composited in linear light") {
    bytes px;  // 3x1: opaque, transparent, alpha 128
    px.insert(px.end(), {10, 200, 30, 255, 250, 250, 250, 0, 200, 200, 200, 128});
    const bytes png = write_png(px.data(), 3, 1, PNG_FORMAT_RGBA);
    CHECK(png[25] == 6);  // truecolour with alpha
    const rgb_image img = decode_ok(png);
    REQUIRE(img.rgb.size() == 9);
    CHECK(bytes(img.rgb.begin(), img.rgb.begin() + 6) == bytes{10, 200, 30, 0, 0, 0});
    // sRGB 200 is 0.578 linear; half of it re-encoded is sRGB ~146.5 (libpng 1.6.39 gives 146;
    // mixing the sRGB values would give 100).
    for (int c = 6; c < 9; ++c) {
      CHECK(img.rgb[static_cast<size_t>(c)] >= 145);
      CHECK(img.rgb[static_cast<size_t>(c)] <= 148);
    }
  }
  SUBCASE("grey") {
    bytes grey;
    for (int i = 0; i < 6 * 4; ++i) grey.push_back(static_cast<uint8_t>(i * 11));
    const bytes png = write_png(grey.data(), 6, 4, PNG_FORMAT_GRAY);
    CHECK(png[25] == 0);
    const rgb_image img = decode_ok(png);
    REQUIRE(img.rgb.size() == grey.size() * 3);
    for (size_t i = 0; i < grey.size(); ++i) {
      CHECK(img.rgb[i * 3] == grey[i]);
      CHECK(img.rgb[i * 3 + 1] == grey[i]);
      CHECK(img.rgb[i * 3 + 2] == grey[i]);
    }
  }
  SUBCASE("palette") {
    const bytes colormap{255, 0, 0, 0, 255, 0, 0, 0, 255, 17, 34, 51};
    const bytes index{0, 1, 2, 3, 3, 2, 1, 0};
    const bytes png = write_png(index.data(), 4, 2, PNG_FORMAT_RGB_COLORMAP, colormap);
    CHECK(png[25] == 3);  // indexed colour
    const rgb_image img = decode_ok(png);
    REQUIRE(img.rgb.size() == 24);
    for (size_t i = 0; i < index.size(); ++i)
      CHECK(bytes(img.rgb.begin() + 3 * i, img.rgb.begin() + 3 * i + 3) ==
            bytes(colormap.begin() + 3 * index[i], colormap.begin() + 3 * index[i] + 3));
  }
  SUBCASE("16-bit RGB and grey without gAMA are sRGB samples, scaled to 8 bits") {
    const bytes px = pattern(3, 2);
    bytes raw, raw_grey;
    for (int y = 0; y < 2; ++y) {
      raw.push_back(0);
      raw_grey.push_back(0);
      for (int i = 0; i < 9; ++i) raw.insert(raw.end(), 2, px[static_cast<size_t>(y * 9 + i)]);  // v * 257
      for (int x = 0; x < 3; ++x) raw_grey.insert(raw_grey.end(), 2, px[static_cast<size_t>(y * 9 + x * 3)]);
    }
    CHECK(decode_ok(craft_png(3, 2, 16, 2, raw)).rgb == px);
    const rgb_image grey = decode_ok(craft_png(3, 2, 16, 0, raw_grey));
    for (size_t i = 0; i < 6; ++i) {
      CHECK(grey.rgb[i * 3] == px[i * 3]);
      CHECK(grey.rgb[i * 3 + 2] == px[i * 3]);
    }
  }
}

TEST_CASE("image: JPEG decodes to its size within a tolerance of the source") {
  // Quality 95 with 4:2:0 chroma on a smooth gradient: every sample within 8 of the source,
  // the mean absolute error under 1.5 (libjpeg-turbo 2.1.5 measures 4 and 0.67; see the MESSAGE).
  const int w = 64, h = 48;
  const bytes px = gradient(w, h);
  for (bool progressive : {false, true}) {
    CAPTURE(progressive);
    const rgb_image img = decode_ok(write_jpeg(px, w, h, 3, 95, progressive));
    CHECK(img.width == w);
    CHECK(img.height == h);
    REQUIRE(img.rgb.size() == px.size());
    int max_err = 0;
    double sum_err = 0;
    for (size_t i = 0; i < px.size(); ++i) {
      const int e = std::abs(int{img.rgb[i]} - int{px[i]});
      max_err = std::max(max_err, e);
      sum_err += e;
    }
    MESSAGE("JPEG q95 max error ", max_err, ", mean ", sum_err / static_cast<double>(px.size()));
    CHECK(max_err <= 8);
    CHECK(sum_err / static_cast<double>(px.size()) < 1.5);
  }
  SUBCASE("greyscale JPEG becomes equal R, G and B") {
    bytes grey;
    for (int i = 0; i < 16 * 8; ++i) grey.push_back(static_cast<uint8_t>(i % 16 * 16));
    const rgb_image img = decode_ok(write_jpeg(grey, 16, 8, 1, 95, false));
    REQUIRE(img.rgb.size() == grey.size() * 3);
    for (size_t i = 0; i < grey.size(); ++i) {
      CHECK(img.rgb[i * 3] == img.rgb[i * 3 + 1]);
      CHECK(img.rgb[i * 3] == img.rgb[i * 3 + 2]);
      CHECK(std::abs(int{img.rgb[i * 3]} - int{grey[i]}) <= 12);
    }
  }
}

TEST_CASE("image: data URLs round-trip PNG and JPEG payloads") {
  const bytes png = write_png(pattern(5, 3).data(), 5, 3, PNG_FORMAT_RGB);
  for (const char* prefix : {"data:image/png;base64,", "data:image/jpeg;base64,", "data:image/jpg;base64,",
                             "DATA:Image/PNG;BASE64,", "data:image/png;name=cat.png;base64,"}) {
    CAPTURE(prefix);
    const auto r = decode_data_url(std::string(prefix) + base64(png), {});
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().message));
    CHECK(*r == png);
  }
  // Every padding length: 1 to 7 bytes give 0, 2 and 1 '='.
  for (size_t n = 1; n <= 7; ++n) {
    const bytes b(png.begin(), png.begin() + static_cast<std::ptrdiff_t>(n));
    const auto r = decode_data_url("data:image/png;base64," + base64(b), {});
    REQUIRE(r.has_value());
    CHECK(*r == b);
  }
  // And through the decoder: the pixels come back.
  const auto file = decode_data_url("data:image/png;base64," + base64(png), {});
  REQUIRE(file.has_value());
  CHECK(decode_ok(*file).rgb == pattern(5, 3));
}

TEST_CASE("image: bad data URLs are refused with their errc and a precise message") {
  struct bad {
    std::string url;
    image_errc code;
    const char* part;
  };
  const std::string png = "data:image/png;base64,";
  const std::vector<bad> cases = {
      {"", image_errc::bad_data_url, "image URL is empty"},
      {"http://example.com/cat.png", image_errc::bad_data_url, "only data URLs"},
      {"https://example.com/cat.png", image_errc::bad_data_url, "the server fetches nothing remote"},
      {"HTTPS://example.com/cat.png", image_errc::bad_data_url, "remote https URL"},
      {"ftp://example.com/cat.png", image_errc::bad_data_url, "scheme 'ftp'"},
      {"cat.png", image_errc::bad_data_url, "not a data URL"},
      {"data:image/png,iVBORw0K", image_errc::bad_data_url, "not base64-encoded (no ';base64'"},
      {"data:image/png;base64", image_errc::bad_data_url, "no ','"},
      {"data:;base64,AAAA", image_errc::bad_data_url, "no media type"},
      {"data:image/gif;base64,R0lGODlh", image_errc::unsupported_format, "image format 'gif'"},
      {"data:image/gif;base64,R0lGODlh", image_errc::unsupported_format, "PNG and JPEG are supported"},
      {"data:image/webp;base64,UklGRg==", image_errc::unsupported_format, "'webp'"},
      {"data:text/plain;base64,aGk=", image_errc::unsupported_format, "'text/plain' is not an image"},
      {png + "AAAA*AAA", image_errc::bad_base64, "a character '*' at offset 4 outside the base64 alphabet"},
      {png + "AAAA AAA", image_errc::bad_base64, "whitespace (byte 0x20) at offset 4"},
      {png + "AAAA\nAAA", image_errc::bad_base64, "whitespace (byte 0x0a) at offset 4"},
      {png + "AA-A", image_errc::bad_base64, "URL-safe base64 is not accepted"},
      {png + "AAAA\x80" "AAA", image_errc::bad_base64, "a byte 0x80 at offset 4"},
      {png + "AAAAA", image_errc::bad_base64, "5 characters long, not a multiple of 4"},
      {png + "AAAAAA=", image_errc::bad_base64, "7 characters long, not a multiple of 4"},
      {png + "AA=A", image_errc::bad_base64, "'=' at offset 2 before its end"},
      {png + "A===", image_errc::bad_base64, "'=' at offset 1 before its end"},
      {png + "AA==AAAA", image_errc::bad_base64, "'=' at offset 2 before its end"},
      {png, image_errc::bad_base64, "base64 payload is empty"},
      {png + "AAAAAAAAAA==", image_errc::too_many_bytes, "image is 7 bytes after base64 decoding; the limit is 6"},
      {png + "AAAAAAAAAAAA", image_errc::too_many_bytes, "image is 9 bytes"},
      {png + "****************", image_errc::too_many_bytes, "12 bytes"},  // size is checked first
  };
  image_limits limits;
  limits.max_bytes = 6;
  for (const bad& c : cases) {
    CAPTURE(c.url);
    const auto r = decode_data_url(c.url, limits);
    REQUIRE(!r.has_value());
    CAPTURE(r.error().message);
    CHECK(image_errc_name(r.error().code) == std::string(image_errc_name(c.code)));
    CHECK(r.error().message.find(c.part) != std::string::npos);
  }
  // Exactly at the limit is accepted.
  const auto six = decode_data_url(png + "AAAAAAAA", limits);
  REQUIRE(six.has_value());
  CHECK(six->size() == 6);
  CHECK(std::string(to_string(image_errc::too_many_pixels)) == "too_many_pixels");
}

TEST_CASE("image: foreign formats and non-images are refused by their magic") {
  const auto of = [](std::string_view s) { return bytes(s.begin(), s.end()); };
  check_error(decode_image(bytes{}, {}), image_errc::not_an_image, "image data is empty");
  check_error(decode_image(of("hello, this is text"), {}), image_errc::not_an_image,
              "starts with bytes 68 65 6c 6c 6f 2c 20 74");
  check_error(decode_image(of("BMW is a car brand, not a bitmap"), {}), image_errc::not_an_image, "neither a PNG");
  check_error(decode_image(of("GIF89a\x01\x00\x01\x00"), {}), image_errc::unsupported_format, "GIF");
  check_error(decode_image(of(std::string_view("RIFF\x24\0\0\0WEBPVP8 ", 16)), {}), image_errc::unsupported_format,
              "a WebP file; only PNG and JPEG images are supported");
  check_error(decode_image(of(std::string_view("II*\0\x08\0\0\0", 8)), {}), image_errc::unsupported_format, "TIFF");
  bytes bmp = of("BM");
  bmp.resize(18, 0);
  bmp[14] = 40;
  check_error(decode_image(bmp, {}), image_errc::unsupported_format, "BMP");
}

TEST_CASE("image: truncated PNG and JPEG are reported as truncated") {
  const bytes png = write_png(pattern(9, 7).data(), 9, 7, PNG_FORMAT_RGB);
  const bytes jpeg = write_jpeg(gradient(24, 16), 24, 16, 3, 90, false);
  // Every prefix that keeps a recognisable signature, up to the IEND chunk / EOI marker.
  for (size_t n = 4; n < png.size() - 12; ++n) {
    CAPTURE(n);
    check_error(decode_image(bytes(png.begin(), png.begin() + static_cast<std::ptrdiff_t>(n)), {}),
                image_errc::truncated, "ends");
  }
  for (size_t n = 2; n < jpeg.size(); ++n) {
    CAPTURE(n);
    check_error(decode_image(bytes(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(n)), {}),
                image_errc::truncated, "ends");
  }
  // Every pixel present but IEND missing or cut: accepted, as libpng stops after the last row;
  // bytes after a JPEG's EOI are ignored.
  CHECK(decode_ok(bytes(png.begin(), png.end() - 12)).rgb == pattern(9, 7));
  CHECK(decode_ok(bytes(png.begin(), png.end() - 6)).rgb == pattern(9, 7));
  bytes padded = jpeg;
  padded.insert(padded.end(), {0, 1, 2});
  CHECK(decode_ok(padded).width == 24);
  check_error(decode_image(bytes(png.begin(), png.begin() + static_cast<std::ptrdiff_t>(png.size() / 2)), {}),
              image_errc::truncated, "image data ends before the PNG image is complete (truncated)");
  check_error(decode_image(bytes(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() / 2)), {}),
              image_errc::truncated, "image data ends before the JPEG image is complete (truncated)");
}

TEST_CASE("image: a header claiming too many pixels is refused before decoding") {
  SUBCASE("PNG 100000x100000 with a valid IHDR CRC") {
    bytes png = write_png(pattern(4, 4).data(), 4, 4, PNG_FORMAT_RGB);
    for (size_t at : {size_t{16}, size_t{20}}) {  // IHDR width, height
      png[at] = 0, png[at + 1] = 0x01, png[at + 2] = 0x86, png[at + 3] = 0xa0;  // 100000
    }
    fix_png_crcs(png);
    // 3e10 bytes of RGB: had it been allocated, this would not return at all.
    check_error(decode_image(png, {}), image_errc::too_many_pixels,
                "image is 100000x100000 = 10000000000 pixels; the limit is 16777216");
  }
  SUBCASE("JPEG 65000x65000 in its SOF") {
    bytes jpeg = write_jpeg(gradient(16, 16), 16, 16, 3, 90, false);
    size_t sof = 2;
    while (sof + 9 < jpeg.size() && !(jpeg[sof] == 0xff && jpeg[sof + 1] == 0xc0)) ++sof;
    REQUIRE(sof + 9 < jpeg.size());
    for (size_t at : {sof + 5, sof + 7}) jpeg[at] = 0xfd, jpeg[at + 1] = 0xe8;  // 65000
    check_error(decode_image(jpeg, {}), image_errc::too_many_pixels, "image is 65000x65000 = 4225000000 pixels");
  }
  SUBCASE("a small limit refuses a real image by one pixel") {
    const bytes png = write_png(pattern(8, 8).data(), 8, 8, PNG_FORMAT_RGB);
    image_limits limits;
    limits.max_pixels = 63;
    check_error(decode_image(png, limits), image_errc::too_many_pixels, "image is 8x8 = 64 pixels; the limit is 63");
    limits.max_pixels = 64;
    CHECK(decode_ok(png, limits).width == 8);
  }
}

TEST_CASE("image: resize_area averages exact areas") {
  SUBCASE("a constant image stays constant, up and down") {
    bytes px;
    for (int i = 0; i < 7 * 5; ++i) px.insert(px.end(), {10, 200, 33});
    const rgb_image in = make_image(7, 5, px);
    for (auto [w, h] : std::vector<std::pair<int, int>>{{3, 2}, {11, 13}, {1, 1}, {7, 5}, {14, 3}}) {
      const rgb_image out = resize_area(in, w, h);
      REQUIRE(out.rgb.size() == static_cast<size_t>(w * h * 3));
      for (size_t i = 0; i < out.rgb.size(); i += 3) CHECK(bytes(out.rgb.begin() + i, out.rgb.begin() + i + 3) == bytes{10, 200, 33});
    }
  }
  SUBCASE("4x4 to 2x2 averages 2x2 blocks") {
    // Channel 0 holds the values below; channel 1 is 255 - value; channel 2 is 0.
    const int v[16] = {0, 4, 100, 101,  //
                       8, 12, 102, 103,  //
                       50, 50, 0, 0,  //
                       51, 50, 0, 1};
    bytes px;
    for (int x : v) px.insert(px.end(), {static_cast<uint8_t>(x), static_cast<uint8_t>(255 - x), 0});
    const rgb_image out = resize_area(make_image(4, 4, px), 2, 2);
    // (0+4+8+12)/4 = 6, (100+101+102+103)/4 = 101.5 -> 102, (50+50+51+50)/4 = 50.25 -> 50, 1/4 -> 0
    CHECK(out.rgb == bytes{6, 249, 0, 102, 154, 0, 50, 205, 0, 0, 255, 0});
  }
  SUBCASE("3x1 to 2x1: weights 2/3 and 1/3") {
    const rgb_image out = resize_area(make_image(3, 1, {0, 30, 255, 100, 60, 255, 200, 90, 0}), 2, 1);
    // out0 = (2*a + b) / 3, out1 = (b + 2*c) / 3
    CHECK(out.rgb == bytes{33, 40, 255, 167, 80, 85});
  }
  SUBCASE("2x1 to 1x1 rounds half up; 2x1 to 3x1 blends only the straddling pixel") {
    CHECK(resize_area(make_image(2, 1, {0, 1, 2, 1, 2, 4}), 1, 1).rgb == bytes{1, 2, 3});
    CHECK(resize_area(make_image(2, 1, {10, 0, 0, 20, 0, 0}), 3, 1).rgb == bytes{10, 0, 0, 15, 0, 0, 20, 0, 0});
    CHECK(resize_area(make_image(2, 1, {10, 0, 0, 20, 0, 0}), 4, 1).rgb ==
          bytes{10, 0, 0, 10, 0, 0, 20, 0, 0, 20, 0, 0});
  }
  SUBCASE("same size is the identity; vertical weights match horizontal ones") {
    const rgb_image in = make_image(5, 3, pattern(5, 3));
    CHECK(resize_area(in, 5, 3).rgb == in.rgb);
    const rgb_image col = resize_area(make_image(1, 3, {0, 30, 255, 100, 60, 255, 200, 90, 0}), 1, 2);
    CHECK(col.rgb == bytes{33, 40, 255, 167, 80, 85});
  }
}

TEST_CASE("image: fit_to_patches keeps the aspect ratio on the patch grid") {
  CHECK(fit_to_patches(640, 480, 224, 14) == std::pair<int64_t, int64_t>{224, 168});
  CHECK(fit_to_patches(480, 640, 224, 14) == std::pair<int64_t, int64_t>{168, 224});
  CHECK(fit_to_patches(5, 5, 224, 14) == std::pair<int64_t, int64_t>{14, 14});
  CHECK(fit_to_patches(1000, 10, 224, 14) == std::pair<int64_t, int64_t>{224, 14});
  CHECK(fit_to_patches(224, 224, 224, 14) == std::pair<int64_t, int64_t>{224, 224});
  CHECK(fit_to_patches(100, 50, 224, 14) == std::pair<int64_t, int64_t>{98, 56});    // 7.14 -> 7, 3.57 -> 4
  CHECK(fit_to_patches(21, 7, 224, 14) == std::pair<int64_t, int64_t>{28, 14});      // 1.5 and 0.5 round up
  CHECK(fit_to_patches(4000, 3000, 448, 14) == std::pair<int64_t, int64_t>{448, 336});
  CHECK(fit_to_patches(230, 115, 224, 14) == std::pair<int64_t, int64_t>{224, 112});  // 112 / 14 = 8 exactly
  CHECK(fit_to_patches(1, 1, 56, 14) == std::pair<int64_t, int64_t>{14, 14});
}

TEST_CASE("image: content hash is XXH3-128 of the dimensions and pixels") {
  const rgb_image a = make_image(3, 2, pattern(3, 2));
  bytes buf;
  for (int64_t v : {int64_t{3}, int64_t{2}})
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<uint8_t>(v >> (8 * i)));
  buf.insert(buf.end(), a.rgb.begin(), a.rgb.end());
  const XXH128_hash_t want = XXH3_128bits(buf.data(), buf.size());
  CHECK(image_content_hash(a) == std::array<uint64_t, 2>{want.low64, want.high64});
  rgb_image b = a;
  CHECK(image_content_hash(b) == image_content_hash(a));
  b.rgb[17] ^= 1;
  CHECK(image_content_hash(b) != image_content_hash(a));
  const rgb_image t = make_image(2, 3, pattern(3, 2));  // same bytes, transposed shape
  CHECK(image_content_hash(t) != image_content_hash(a));
  // A decoded PNG hashes like its source pixels.
  CHECK(image_content_hash(decode_ok(write_png(a.rgb.data(), 3, 2, PNG_FORMAT_RGB))) == image_content_hash(a));
}

TEST_CASE("image: fuzzed PNGs and JPEGs decode consistently or fail with a message") {
  const uint32_t seed = 20261202;
  const int fuzz_inputs = 4000;
  MESSAGE("SEED=", seed);
  std::mt19937 rng(seed);
  bytes rgba;
  for (int i = 0; i < 12 * 9; ++i) rgba.insert(rgba.end(), {static_cast<uint8_t>(i), 90, 200, static_cast<uint8_t>(i * 2)});
  const bytes colormap{1, 2, 3, 250, 0, 0, 0, 250, 0};
  bytes index;
  for (int i = 0; i < 10 * 6; ++i) index.push_back(static_cast<uint8_t>(i % 3));
  bytes grey(20 * 20);
  for (size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<uint8_t>(i);
  const std::vector<bytes> pngs = {write_png(pattern(17, 13).data(), 17, 13, PNG_FORMAT_RGB),
                                   write_png(rgba.data(), 12, 9, PNG_FORMAT_RGBA),
                                   write_png(index.data(), 10, 6, PNG_FORMAT_RGB_COLORMAP, colormap)};
  const std::vector<bytes> jpegs = {write_jpeg(gradient(40, 30), 40, 30, 3, 90, false),
                                    write_jpeg(gradient(33, 21), 33, 21, 3, 75, true),
                                    write_jpeg(grey, 20, 20, 1, 85, false)};
  image_limits limits;
  limits.max_pixels = 1 << 16;  // a flipped size bit is refused instead of decoding megapixels
  int accepted = 0, rejected = 0;
  std::map<std::string, int> by_code;
  const auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  for (int iter = 0; iter < fuzz_inputs; ++iter) {
    const bool is_png = iter % 2 == 0;
    bytes f = is_png ? pngs[below(3)] : jpegs[below(3)];
    mutate(f, is_png, rng);
    const auto r = decode_image(f, limits);
    if (r) {
      ++accepted;
      CHECK(r->width >= 1);
      CHECK(r->height >= 1);
      CHECK(r->width * r->height <= limits.max_pixels);
      CHECK(r->rgb.size() == static_cast<size_t>(r->width * r->height * 3));
    } else {
      ++rejected;
      ++by_code[image_errc_name(r.error().code)];
      CHECK(!r.error().message.empty());
    }
  }
  std::string codes;
  for (const auto& [name, n] : by_code) codes += " " + name + "=" + std::to_string(n);
  MESSAGE("fuzz: ", accepted, " accepted, ", rejected, " rejected:", codes);
  CHECK(accepted + rejected == fuzz_inputs);
  CHECK(accepted > 0);
  CHECK(rejected > 0);
  CHECK(by_code["truncated"] > 0);
  CHECK(by_code["corrupt"] > 0);
  CHECK(by_code["too_many_pixels"] > 0);
}
