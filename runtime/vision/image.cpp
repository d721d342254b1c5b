// Image input implementation: data URLs are validated by hand and their base64 decoded by
// OpenSSL; PNG goes through libpng's simplified API and JPEG through libjpeg-turbo with a
// longjmp error handler, both behind a header-only pixel-limit check; area resampling and the
// content hash are plain loops. No libjpeg or libpng message ever reaches stderr.
#include "runtime/vision/image.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <png.h>
#include <xxhash.h>

// jpeglib.h needs FILE and size_t declared first; jerror.h names the warning codes.
#include <csetjmp>
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <memory>

#include "kernels/assert.hpp"

namespace shoal::runtime {

const char* image_errc_name(image_errc e) {
  switch (e) {
    case image_errc::bad_data_url: return "bad_data_url";
    case image_errc::bad_base64: return "bad_base64";
    case image_errc::too_many_bytes: return "too_many_bytes";
    case image_errc::unsupported_format: return "unsupported_format";
    case image_errc::not_an_image: return "not_an_image";
    case image_errc::truncated: return "truncated";
    case image_errc::corrupt: return "corrupt";
    case image_errc::too_many_pixels: return "too_many_pixels";
  }
  return "unknown";
}

namespace {

using unexpected_error = std::unexpected<image_error>;

unexpected_error fail(image_errc code, std::string message) {
  return unexpected_error(image_error{code, std::move(message)});
}

// ---------------------------------------------------------------------------------------
// Data URLs
// ---------------------------------------------------------------------------------------

constexpr std::string_view accepted_urls = "data:image/png;base64,... or data:image/jpeg;base64,...";

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Client text echoed back in a message: printable ASCII only, at most 40 characters.
std::string echo(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > 40) out += "...";
  return out;
}

// The scheme of an absolute URL ("ftp" of "ftp://x"), or empty when `url` has none.
std::string_view url_scheme(std::string_view url) {
  const size_t colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0) return {};
  if (!std::isalpha(static_cast<unsigned char>(url[0]))) return {};
  for (size_t i = 1; i < colon; ++i) {
    const auto c = static_cast<unsigned char>(url[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return {};
  }
  return url.substr(0, colon);
}

unexpected_error not_a_data_url(std::string_view url) {
  if (url.empty()) return fail(image_errc::bad_data_url, fmt::format("image URL is empty; expected {}", accepted_urls));
  if (starts_with_ci(url, "http://") || starts_with_ci(url, "https://")) {
    return fail(image_errc::bad_data_url,
                fmt::format("image URL is a remote {} URL; only data URLs ({}) are accepted: the server "
                            "fetches nothing remote",
                            lower(url_scheme(url)), accepted_urls));
  }
  const std::string_view scheme = url_scheme(url);
  if (!scheme.empty()) {
    return fail(image_errc::bad_data_url,
                fmt::format("image URL has scheme '{}'; only data URLs ({}) are accepted", echo(scheme),
                            accepted_urls));
  }
  return fail(image_errc::bad_data_url, fmt::format("image URL is not a data URL; expected {}", accepted_urls));
}

// Checks "image/png" / "image/jpeg" / "image/jpg" and the trailing ";base64" of the part
// between "data:" and ",".
std::expected<void, image_error> check_data_url_header(std::string_view header) {
  const size_t semi = header.find(';');
  const std::string media = lower(header.substr(0, semi));
  if (media.empty()) {
    return fail(image_errc::bad_data_url,
                fmt::format("data URL has no media type; expected {}", accepted_urls));
  }
  if (!media.starts_with("image/")) {
    return fail(image_errc::unsupported_format,
                fmt::format("data URL media type '{}' is not an image; PNG (image/png) and JPEG (image/jpeg) "
                            "are supported",
                            echo(media)));
  }
  const std::string_view sub = std::string_view(media).substr(6);
  if (sub != "png" && sub != "jpeg" && sub != "jpg") {
    return fail(image_errc::unsupported_format,
                fmt::format("image format '{}' (data URL media type {}) is not supported; PNG and JPEG are "
                            "supported",
                            echo(sub), echo(media)));
  }
  const size_t last = header.rfind(';');
  if (semi == std::string_view::npos || lower(header.substr(last + 1)) != "base64") {
    return fail(image_errc::bad_data_url,
                fmt::format("data URL is not base64-encoded (no ';base64' before the ','); only base64 data "
                            "URLs ({}) are accepted",
                            accepted_urls));
  }
  return {};
}

bool is_base64_char(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
}

std::string describe_char(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return fmt::format("whitespace (byte 0x{:02x})", c);
  if (c > 0x20 && c < 0x7f) return fmt::format("a character '{}'", static_cast<char>(c));
  return fmt::format("a byte 0x{:02x}", c);
}

// Strict RFC 4648 base64, checked by hand: OpenSSL's EVP_DecodeBlock skips whitespace and
// does not say where a payload went wrong.
std::expected<void, image_error> validate_base64(std::string_view p) {
  for (size_t i = 0; i < p.size(); ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    if (is_base64_char(c)) continue;
    if (c == '=') {
      const bool final_pad = i == p.size() - 1 || (i == p.size() - 2 && p.back() == '=');
      if (final_pad) continue;
      return fail(image_errc::bad_base64,
                  fmt::format("base64 payload has '=' at offset {} before its end; '=' may only pad the last one "
                              "or two characters",
                              i));
    }
    const char* hint = (c == '-' || c == '_') ? " (URL-safe base64 is not accepted; use '+' and '/')" : "";
    return fail(image_errc::bad_base64,
                fmt::format("base64 payload has {} at offset {} outside the base64 alphabet{}", describe_char(c), i,
                            hint));
  }
  if (p.size() % 4 != 0) {
    return fail(image_errc::bad_base64,
                fmt::format("base64 payload is {} characters long, not a multiple of 4 (missing '=' padding?)",
                            p.size()));
  }
  return {};
}

// Decodes validated base64 with OpenSSL, in chunks so each call's length fits an int.
std::vector<uint8_t> decode_base64(std::string_view p, size_t pad) {
  constexpr size_t chunk_chars = size_t{4} << 20;  // a multiple of 4
  std::vector<uint8_t> out(p.size() / 4 * 3);
  size_t written = 0;
  for (size_t at = 0; at < p.size(); at += chunk_chars) {
    const size_t n = std::min(chunk_chars, p.size() - at);
    const int got = EVP_DecodeBlock(out.data() + written, reinterpret_cast<const unsigned char*>(p.data() + at),
                                    static_cast<int>(n));
    SHOAL_ASSERT(got == static_cast<int>(n / 4 * 3));  // validated above; -1 would be a bug here
    written += static_cast<size_t>(got);
  }
  out.resize(written - pad);  // EVP_DecodeBlock counts the bytes the '=' padding stands for
  return out;
}

}  // namespace

std::expected<std::vector<uint8_t>, image_error> decode_data_url(std::string_view url, const image_limits& limits) {
  if (!starts_with_ci(url, "data:")) return not_a_data_url(url);
  const std::string_view rest = url.substr(5);
  const size_t comma = rest.find(',');
  if (comma == std::string_view::npos) {
    return fail(image_errc::bad_data_url, "data URL has no ',' separating the media type from the payload");
  }
  if (auto ok = check_data_url_header(rest.substr(0, comma)); !ok) return std::unexpected(ok.error());
  const std::string_view payload = rest.substr(comma + 1);
  if (payload.empty()) return fail(image_errc::bad_base64, "base64 payload is empty");

  // The size from the length alone, before any character is looked at or decoded.
  const size_t pad = payload.ends_with("==") ? 2 : payload.ends_with('=') ? 1 : 0;
  const int64_t decoded_bytes = static_cast<int64_t>(payload.size() / 4 * 3 + (payload.size() % 4) * 3 / 4) -
                                static_cast<int64_t>(pad);
  if (decoded_bytes > limits.max_bytes) {
    return fail(image_errc::too_many_bytes,
                fmt::format("image is {} bytes after base64 decoding; the limit is {}", decoded_bytes,
                            limits.max_bytes));
  }
  if (auto ok = validate_base64(payload); !ok) return std::unexpected(ok.error());
  return decode_base64(payload, pad);
}

namespace {

// ---------------------------------------------------------------------------------------
// Format detection
// ---------------------------------------------------------------------------------------

enum class image_format { png, jpeg };

constexpr std::array<uint8_t, 8> png_signature{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

bool has_prefix(std::span<const uint8_t> b, std::string_view magic, size_t at = 0) {
  if (b.size() < at + magic.size()) return false;
  return std::memcmp(b.data() + at, magic.data(), magic.size()) == 0;
}

// The name of a format we recognise but do not decode, or nullptr.
const char* other_format_name(std::span<const uint8_t> b) {
  if (has_prefix(b, "GIF87a") || has_prefix(b, "GIF89a")) return "GIF";
  if (has_prefix(b, "RIFF") && has_prefix(b, "WEBP", 8)) return "WebP";
  if (has_prefix(b, std::string_view("II*\0", 4)) || has_prefix(b, std::string_view("MM\0*", 4))) return "TIFF";
  if (has_prefix(b, std::string_view("\0\0\0\x0cjP  ", 8))) return "JPEG 2000";
  if (has_prefix(b, "ftypavif", 4) || has_prefix(b, "ftypavis", 4)) return "AVIF";
  if (has_prefix(b, "ftypheic", 4) || has_prefix(b, "ftypheix", 4) || has_prefix(b, "ftypmif1", 4)) return "HEIF";
  if (has_prefix(b, "BM") && b.size() >= 18) {  // "BM" alone is too weak: check the DIB header size too
    const uint32_t dib = uint32_t{b[14]} | (uint32_t{b[15]} << 8) | (uint32_t{b[16]} << 16) | (uint32_t{b[17]} << 24);
    if (dib == 12 || dib == 40 || dib == 52 || dib == 56 || dib == 64 || dib == 108 || dib == 124) return "BMP";
  }
  return nullptr;
}

std::expected<image_format, image_error> detect_format(std::span<const uint8_t> b) {
  if (b.empty()) return fail(image_errc::not_an_image, "image data is empty");
  if (b.size() >= 8 && std::equal(png_signature.begin(), png_signature.end(), b.begin())) return image_format::png;
  if (b.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return image_format::jpeg;
  if (b.size() < 8 && b.size() >= 4 && std::equal(b.begin(), b.end(), png_signature.begin())) {
    return fail(image_errc::truncated, "image data ends inside the PNG signature (truncated)");
  }
  if (b.size() == 2 && b[0] == 0xff && b[1] == 0xd8) {
    return fail(image_errc::truncated, "image data ends after the JPEG start marker (truncated)");
  }
  if (const char* name = other_format_name(b)) {
    return fail(image_errc::unsupported_format,
                fmt::format("image is a {} file; only PNG and JPEG images are supported", name));
  }
  std::string head;
  for (size_t i = 0; i < b.size() && i < 8; ++i) head += fmt::format("{}{:02x}", i ? " " : "", b[i]);
  return fail(image_errc::not_an_image,
              fmt::format("image data starts with bytes {}, neither a PNG nor a JPEG signature", head));
}

unexpected_error too_many_pixels(int64_t w, int64_t h, int64_t limit) {
  return fail(image_errc::too_many_pixels,
              fmt::format("image is {}x{} = {} pixels; the limit is {}", w, h, w * h, limit));
}

// ---------------------------------------------------------------------------------------
// PNG (libpng simplified API)
// ---------------------------------------------------------------------------------------

// png_image_free is safe after libpng freed the image itself (on error), so always call it.
struct png_image_guard {
  png_image* img;
  ~png_image_guard() { png_image_free(img); }
};

unexpected_error png_failure(const char* message) {
  const std::string_view m(message);
  // Memory reads past the end fail as "read beyond end of data"; "Not enough image data" is
  // an IDAT stream that stops before the last row, i.e. the image data was cut short.
  if (m.find("read beyond end of data") != std::string_view::npos ||
      m.find("Not enough image data") != std::string_view::npos) {
    return fail(image_errc::truncated, "image data ends before the PNG image is complete (truncated)");
  }
  if (m.find("exceeds user limit") != std::string_view::npos) {
    return fail(image_errc::too_many_pixels,
                fmt::format("PNG image is wider or taller than libpng accepts ({})", echo(m)));
  }
  return fail(image_errc::corrupt, fmt::format("image data is not a valid PNG: {}", echo(m)));
}

std::expected<rgb_image, image_error> decode_png(std::span<const uint8_t> bytes, const image_limits& limits) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  png_image_guard guard{&img};
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size())) return png_failure(img.message);

  const auto w = static_cast<int64_t>(img.width), h = static_cast<int64_t>(img.height);
  if (w * h > limits.max_pixels) return too_many_pixels(w, h, limits.max_pixels);
  img.format = PNG_FORMAT_RGB;
  img.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;  // untagged 16-bit samples are sRGB, not linear
  rgb_image out;
  out.width = w;
  out.height = h;
  out.rgb.resize(static_cast<size_t>(w * h * 3));
  const png_color black{0, 0, 0};
  if (!png_image_finish_read(&img, &black, out.rgb.data(), static_cast<png_int_32>(w * 3), nullptr)) {
    return png_failure(img.message);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// JPEG (libjpeg-turbo)
// ---------------------------------------------------------------------------------------

constexpr int max_jpeg_scans = 500;  // bounds the work of a progressive JPEG, as TurboJPEG does

// cinfo.err points at `pub`, so the handlers reach the rest through it.
struct jpeg_context {
  jpeg_error_mgr pub;
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  bool eof_warning;  // "Premature end of JPEG file": libjpeg padded the data with a fake EOI
  char message[JMSG_LENGTH_MAX];
};

jpeg_context* context_of(j_common_ptr c) { return reinterpret_cast<jpeg_context*>(c->err); }

void jpeg_error_exit(j_common_ptr c) {
  jpeg_context* ctx = context_of(c);
  (*c->err->format_message)(c, ctx->message);
  std::longjmp(ctx->jump, 1);
}

void jpeg_emit_message(j_common_ptr c, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  if (c->err->msg_code == JWRN_JPEG_EOF) context_of(c)->eof_warning = true;
  ++c->err->num_warnings;
}

void jpeg_output_message(j_common_ptr) {}  // nothing is printed

void jpeg_progress(j_common_ptr c) {
  if (!c->is_decompressor) return;
  if (reinterpret_cast<j_decompress_ptr>(c)->input_scan_number <= max_jpeg_scans) return;
  jpeg_context* ctx = context_of(c);
  std::snprintf(ctx->message, sizeof ctx->message, "progressive JPEG has more than %d scans", max_jpeg_scans);
  std::longjmp(ctx->jump, 1);
}

enum class jpeg_outcome { ok, failed, too_many_pixels, cmyk };

// The only frame libjpeg longjmps into: it holds no object with a destructor, and nothing it
// reads after the jump was changed after setjmp (out, w and h belong to the caller).
jpeg_outcome run_jpeg(jpeg_decompress_struct& cinfo, jpeg_context& ctx, std::span<const uint8_t> bytes,
                      int64_t max_pixels, std::vector<uint8_t>& out, int64_t& w, int64_t& h) {
  if (setjmp(ctx.jump)) return jpeg_outcome::failed;
  jpeg_create_decompress(&cinfo);
  cinfo.progress = &ctx.progress;
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (ctx.eof_warning) return jpeg_outcome::failed;
  w = cinfo.image_width;
  h = cinfo.image_height;
  if (w * h > max_pixels) return jpeg_outcome::too_many_pixels;
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) return jpeg_outcome::cmyk;
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  SHOAL_ASSERT(cinfo.output_components == 3 && cinfo.output_width == w && cinfo.output_height == h);
  out.resize(static_cast<size_t>(w * h * 3));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.data() + static_cast<size_t>(cinfo.output_scanline) * static_cast<size_t>(w) * 3;
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) return jpeg_outcome::failed;  // cannot suspend on memory
  }
  jpeg_finish_decompress(&cinfo);
  return ctx.eof_warning ? jpeg_outcome::failed : jpeg_outcome::ok;
}

struct jpeg_guard {
  jpeg_decompress_struct* cinfo;
  ~jpeg_guard() { jpeg_destroy_decompress(cinfo); }  // a no-op before jpeg_create_decompress
};

std::expected<rgb_image, image_error> decode_jpeg(std::span<const uint8_t> bytes, const image_limits& limits) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  auto ctx = std::make_unique<jpeg_context>();  // value-initialised: eof_warning false, message empty
  cinfo.err = jpeg_std_error(&ctx->pub);
  ctx->pub.error_exit = jpeg_error_exit;
  ctx->pub.emit_message = jpeg_emit_message;
  ctx->pub.output_message = jpeg_output_message;
  ctx->progress.progress_monitor = jpeg_progress;
  jpeg_guard guard{&cinfo};

  rgb_image out;
  switch (run_jpeg(cinfo, *ctx, bytes, limits.max_pixels, out.rgb, out.width, out.height)) {
    case jpeg_outcome::ok: return out;
    case jpeg_outcome::too_many_pixels: return too_many_pixels(out.width, out.height, limits.max_pixels);
    case jpeg_outcome::cmyk:
      return fail(image_errc::unsupported_format, "image is a CMYK JPEG; only RGB and greyscale JPEGs are supported");
    case jpeg_outcome::failed: break;
  }
  if (ctx->eof_warning) {
    return fail(image_errc::truncated, "image data ends before the JPEG image is complete (truncated)");
  }
  const char* why = ctx->message[0] ? ctx->message : "the decoder stopped before the last row";
  return fail(image_errc::corrupt, fmt::format("image data is not a valid JPEG: {}", why));
}

}  // namespace

std::expected<rgb_image, image_error> decode_image(std::span<const uint8_t> bytes, const image_limits& limits) {
  const auto format = detect_format(bytes);
  if (!format) return std::unexpected(format.error());
  auto img = *format == image_format::png ? decode_png(bytes, limits) : decode_jpeg(bytes, limits);
  if (img) SHOAL_ASSERT(img->rgb.size() == static_cast<size_t>(img->width * img->height * 3));
  return img;
}

namespace {

// ---------------------------------------------------------------------------------------
// Resampling
// ---------------------------------------------------------------------------------------

// The input pixels one output pixel overlaps along an axis, with integer overlap weights in
// units of 1/out input pixels: input pixel i spans [i*out, (i+1)*out), output pixel o spans
// [o*in, (o+1)*in), so the weights of one output pixel sum to `in`.
struct axis_weights {
  std::vector<int64_t> first;   // (out,) first input index
  std::vector<int64_t> offset;  // (out + 1,) into weight
  std::vector<int64_t> weight;  // (sum of overlaps,)
};

axis_weights make_axis_weights(int64_t in, int64_t out) {
  axis_weights a;
  a.first.resize(static_cast<size_t>(out));
  a.offset.resize(static_cast<size_t>(out) + 1);
  for (int64_t o = 0; o < out; ++o) {
    const int64_t lo = o * in, hi = (o + 1) * in;
    const int64_t i0 = lo / out, i1 = (hi - 1) / out;
    a.first[static_cast<size_t>(o)] = i0;
    a.offset[static_cast<size_t>(o)] = static_cast<int64_t>(a.weight.size());
    for (int64_t i = i0; i <= i1; ++i) a.weight.push_back(std::min((i + 1) * out, hi) - std::max(i * out, lo));
  }
  a.offset[static_cast<size_t>(out)] = static_cast<int64_t>(a.weight.size());
  return a;
}

}  // namespace

rgb_image resize_area(const rgb_image& in, int64_t out_w, int64_t out_h) {
  constexpr int64_t max_side = int64_t{1} << 31;
  SHOAL_ASSERT(in.width >= 1 && in.height >= 1 && in.width < max_side && in.height < max_side);
  SHOAL_ASSERT(in.width * in.height < (int64_t{1} << 50));  // sum of weight * 255 fits 64 bits
  SHOAL_ASSERT(in.rgb.size() == static_cast<size_t>(in.width * in.height * 3));
  SHOAL_ASSERT(out_w >= 1 && out_h >= 1 && out_w < max_side && out_h < max_side);
  const axis_weights ax = make_axis_weights(in.width, out_w);
  const axis_weights ay = make_axis_weights(in.height, out_h);
  const uint64_t den = static_cast<uint64_t>(in.width) * static_cast<uint64_t>(in.height);
  const size_t in_row = static_cast<size_t>(in.width) * 3;

  rgb_image out;
  out.width = out_w;
  out.height = out_h;
  out.rgb.resize(static_cast<size_t>(out_w * out_h * 3));
  std::vector<uint64_t> col(in_row);  // (in_w, 3) vertical weighted sums of one output row
  for (int64_t oy = 0; oy < out_h; ++oy) {
    std::fill(col.begin(), col.end(), 0);
    const auto oyi = static_cast<size_t>(oy);
    for (int64_t k = ay.offset[oyi]; k < ay.offset[oyi + 1]; ++k) {
      const auto wy = static_cast<uint64_t>(ay.weight[static_cast<size_t>(k)]);
      const uint8_t* src = in.rgb.data() + static_cast<size_t>(ay.first[oyi] + k - ay.offset[oyi]) * in_row;
      for (size_t j = 0; j < in_row; ++j) col[j] += wy * src[j];
    }
    uint8_t* dst = out.rgb.data() + oyi * static_cast<size_t>(out_w) * 3;
    for (int64_t ox = 0; ox < out_w; ++ox) {
      const auto oxi = static_cast<size_t>(ox);
      std::array<uint64_t, 3> sum{};
      for (int64_t k = ax.offset[oxi]; k < ax.offset[oxi + 1]; ++k) {
        const auto wx = static_cast<uint64_t>(ax.weight[static_cast<size_t>(k)]);
        const size_t x = static_cast<size_t>(ax.first[oxi] + k - ax.offset[oxi]);
        for (size_t c = 0; c < 3; ++c) sum[c] += wx * col[x * 3 + c];
      }
      for (size_t c = 0; c < 3; ++c) dst[oxi * 3 + c] = static_cast<uint8_t>((sum[c] + den / 2) / den);
    }
  }
  return out;
}

std::pair<int64_t, int64_t> fit_to_patches(int64_t w, int64_t h, int64_t max_side, int64_t patch) {
  constexpr int64_t limit = int64_t{1} << 31;  // keeps 2 * side * max_side in range
  SHOAL_ASSERT(w >= 1 && h >= 1 && w < limit && h < limit);
  SHOAL_ASSERT(patch >= 1 && max_side >= patch && max_side < limit && max_side % patch == 0);
  const int64_t longest = std::max(w, h);
  // side * scale / patch = num / den, rounded half up as (2 num + den) / (2 den).
  const auto fit = [&](int64_t side) {
    const int64_t num = longest > max_side ? side * max_side : side;
    const int64_t den = longest > max_side ? longest * patch : patch;
    const int64_t patches = (2 * num + den) / (2 * den);
    return std::clamp(patches * patch, patch, max_side);
  };
  return {fit(w), fit(h)};
}

std::vector<uint8_t> encode_png(const rgb_image& img) {
  if (img.width <= 0 || img.height <= 0 || img.rgb.size() != static_cast<size_t>(img.width * img.height * 3)) return {};
  png_image p;
  std::memset(&p, 0, sizeof p);
  p.version = PNG_IMAGE_VERSION;
  p.width = static_cast<png_uint_32>(img.width);
  p.height = static_cast<png_uint_32>(img.height);
  p.format = PNG_FORMAT_RGB;
  png_image_guard guard{&p};
  png_alloc_size_t size = 0;
  const auto stride = static_cast<png_int_32>(img.width * 3);
  if (!png_image_write_to_memory(&p, nullptr, &size, 0, img.rgb.data(), stride, nullptr)) return {};
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&p, out.data(), &size, 0, img.rgb.data(), stride, nullptr)) return {};
  out.resize(size);
  return out;
}

std::string png_data_url(const rgb_image& img) {
  const std::vector<uint8_t> png = encode_png(img);
  if (png.empty()) return {};
  std::string b64(4 * ((png.size() + 2) / 3) + 1, '\0');  // EVP_EncodeBlock writes a NUL too
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(b64.data()), png.data(), static_cast<int>(png.size()));
  b64.resize(static_cast<size_t>(n));
  return "data:image/png;base64," + b64;
}

std::array<uint64_t, 2> image_content_hash(const rgb_image& img) {
  std::array<uint8_t, 16> dims;
  for (int i = 0; i < 8; ++i) {
    dims[static_cast<size_t>(i)] = static_cast<uint8_t>(static_cast<uint64_t>(img.width) >> (8 * i));
    dims[static_cast<size_t>(i) + 8] = static_cast<uint8_t>(static_cast<uint64_t>(img.height) >> (8 * i));
  }
  struct state_deleter {
    void operator()(XXH3_state_t* s) const noexcept { XXH3_freeState(s); }
  };
  const std::unique_ptr<XXH3_state_t, state_deleter> st{XXH3_createState()};
  SHOAL_ASSERT(st != nullptr && XXH3_128bits_reset(st.get()) == XXH_OK);
  XXH3_128bits_update(st.get(), dims.data(), dims.size());
  if (!img.rgb.empty()) XXH3_128bits_update(st.get(), img.rgb.data(), img.rgb.size());
  const XXH128_hash_t hash = XXH3_128bits_digest(st.get());
  return {hash.low64, hash.high64};
}

}  // namespace shoal::runtime
