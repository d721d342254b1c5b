// Image inputs of chat requests, decoded before the vision encoder runs: a data URL
// ("data:image/png;base64,...") becomes bytes, the bytes become 8-bit RGB pixels (PNG through
// libpng, JPEG through libjpeg-turbo), and the pixels are resized to the encoder's patch grid
// and hashed for the prefix cache. All of it is untrusted input: every failure is an
// image_error naming the problem, never a crash, and pixel limits are checked from the header
// before any pixel buffer is allocated.
#pragma once

#include <array>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shoal::runtime {

struct image_limits {
  int64_t max_bytes = 20 << 20;         // of the decoded base64 payload (the file itself)
  int64_t max_pixels = 4096 * 4096;     // width * height, read from the header before decoding
};

// Row-major pixels, 8-bit sRGB values as the file stores them (no ICC colour management).
struct rgb_image {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;  // (height, width, 3)
  friend bool operator==(const rgb_image&, const rgb_image&) = default;
};

enum class image_errc : uint8_t {
  bad_data_url,        // not a data URL (http(s) included: nothing remote is fetched), or no ;base64
  bad_base64,          // outside the alphabet, wrong length, misplaced '=', empty
  too_many_bytes,      // decoded payload over image_limits::max_bytes
  unsupported_format,  // a media type or file format other than PNG and JPEG (GIF, WebP, ...)
  not_an_image,        // bytes no known image format starts with
  truncated,           // the data ends before the image is complete
  corrupt,             // the decoder refused the data (CRC, bad marker, invalid header, ...)
  too_many_pixels,     // width * height over image_limits::max_pixels
};
const char* image_errc_name(image_errc e);  // "bad_data_url", ...
inline const char* to_string(image_errc e) { return image_errc_name(e); }

// message is written for an API client; callers with several images prefix "image N: ".
struct image_error {
  image_errc code = image_errc::corrupt;
  std::string message;
};

// The payload of `data:image/png;base64,...` or `data:image/jpeg;base64,...` (image/jpg too);
// scheme and media type are case-insensitive, parameters before ";base64" are ignored. The
// base64 is strict: standard alphabet, no whitespace, length a multiple of 4, '=' only as the
// last one or two characters. The decoded size is computed from the length and checked
// against limits.max_bytes before anything is decoded.
std::expected<std::vector<uint8_t>, image_error> decode_data_url(std::string_view url,
                                                                 const image_limits& limits);

// Decodes a PNG or JPEG, told apart by magic bytes (PNG signature; JPEG SOI FF D8 FF). Grey,
// palette, 16-bit and alpha inputs all become 8-bit RGB: 16-bit samples without gAMA/sRGB
// chunks are taken as sRGB-encoded and scaled to 8 bits; alpha is dropped by compositing onto
// black (libpng composites in linear light, so a half-transparent 200 becomes 146, not 100);
// a PNG gAMA chunk is honoured by libpng's conversion to sRGB. A PNG is complete once its last
// row is decoded (a missing IEND is not an error). A JPEG whose data ends early is
// truncated even though libjpeg could fill the rest with grey; other libjpeg warnings (e.g.
// extraneous bytes before a marker, common in real files) are accepted. CMYK JPEGs and
// progressive JPEGs with more than 500 scans are refused.
std::expected<rgb_image, image_error> decode_image(std::span<const uint8_t> bytes,
                                                   const image_limits& limits);

// Area-averaging (box filter) resampling to (out_h, out_w). Output pixel (ox, oy) covers the
// input rectangle [ox*in_w/out_w, (ox+1)*in_w/out_w) x [oy*in_h/out_h, (oy+1)*in_h/out_h)
// and is the average of the input over it, each input pixel weighted by the exact area of
// its overlap, rounded to nearest (ties up). Weights are integers in units of
// 1/(in_w*out_w) per axis, so the result is exact and deterministic. Downscaling averages
// blocks; upscaling gives each output pixel the input pixel covering it, or the area-weighted
// blend of two where it straddles an input boundary. Requires a non-empty input and
// out_w, out_h >= 1 (asserted).
rgb_image resize_area(const rgb_image& in, int64_t out_w, int64_t out_h);

// Target size for a vision encoder with square patches: scale = min(1, max_side / max(w, h)),
// each side becomes round(side * scale / patch) * patch (half rounds up, exact integer
// arithmetic), clamped to [patch, max_side]. Returns {width, height}. Requires w, h, patch
// >= 1 and max_side a positive multiple of patch (asserted). 640x480, 224, 14 -> 224x168.
std::pair<int64_t, int64_t> fit_to_patches(int64_t w, int64_t h, int64_t max_side, int64_t patch);

// An 8-bit RGB PNG of `img` (libpng's simplified writer): what clients such as the benches
// send. Empty if libpng refused (an empty or oversized image).
std::vector<uint8_t> encode_png(const rgb_image& img);
// "data:image/png;base64,..." of encode_png(img) (OpenSSL's EVP_EncodeBlock); empty if that is.
std::string png_data_url(const rgb_image& img);

// XXH3-128 over width and height (little-endian int64) then the rgb bytes: the same pixels
// give the same hash on every machine. Returned as {low64, high64}.
std::array<uint64_t, 2> image_content_hash(const rgb_image& img);

}  // namespace shoal::runtime
