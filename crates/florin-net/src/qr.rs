//! Offline messages as QR codes: PNG images (and an animated GIF for multi-part messages).
//!
//! A message larger than one code is split into numbered parts. Each part carries a header
//! (`FQ`, version, kind, 8-byte message id, part index, part count) so parts reassemble in any
//! order and parts of different messages are never mixed. The codes carry the same bytes as the
//! request and payment files: a payment is bound to the payee's key and the request's fresh
//! handshake, so a photographed code is useless to anyone but the intended payee, and a code
//! shown twice is refused as a replay by the payee's wallet.

use std::collections::BTreeMap;
use std::io::Cursor;

use florin_crypto::hash;
use qrcode::{Color, EcLevel, QrCode};
use thiserror::Error;

/// Payload bytes per code (a version-26-or-so code at error correction level M).
pub const PART_BYTES: usize = 1_000;
/// Most parts in one message.
pub const MAX_PARTS: usize = 4_096;
/// Pixels per module in rendered images.
const SCALE: usize = 4;
/// Quiet zone around a code, in modules.
const QUIET: usize = 4;
/// Largest image accepted for decoding, in pixels.
const MAX_PIXELS: usize = 40_000_000;
const MAGIC: &[u8; 2] = b"FQ";
const VERSION: u8 = 1;
const HEADER: usize = 2 + 1 + 1 + 8 + 2 + 2;

/// What a QR message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A payment request.
    Request,
    /// A payment.
    Payment,
}

/// Why QR encoding or decoding failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QrError {
    /// The image could not be read.
    #[error("image: {0}")]
    Image(String),
    /// No QR code was found, or it could not be decoded.
    #[error("no readable Florin QR code in the image")]
    NoCode,
    /// A code that is not a Florin part.
    #[error("the QR code is not a Florin message part")]
    Foreign,
    /// Parts of different messages or kinds.
    #[error("the parts belong to different messages")]
    Mixed,
    /// Parts missing.
    #[error("parts missing: have {have} of {total}")]
    Incomplete {
        /// Parts present.
        have: usize,
        /// Parts in the message.
        total: usize,
    },
    /// The message is too large for QR codes.
    #[error("message of {0} bytes needs more than {MAX_PARTS} codes; use the device channel")]
    TooLarge(usize),
    /// The same part number with different contents.
    #[error("part {0} appears twice with different contents")]
    Conflict(usize),
}

/// One decoded part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The kind.
    pub kind: Kind,
    /// The message id.
    pub id: [u8; 8],
    /// Index, from 0.
    pub index: usize,
    /// Number of parts.
    pub total: usize,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Splits `msg` into part payloads.
pub fn split(kind: Kind, msg: &[u8]) -> Result<Vec<Vec<u8>>, QrError> {
    let total = msg.len().div_ceil(PART_BYTES).max(1);
    if total > MAX_PARTS {
        return Err(QrError::TooLarge(msg.len()));
    }
    let digest = hash("florin/qr/message/v1", &[msg]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    let k = match kind {
        Kind::Request => 1,
        Kind::Payment => 2,
    };
    Ok((0..total)
        .map(|i| {
            let data = &msg[i * PART_BYTES..((i + 1) * PART_BYTES).min(msg.len())];
            let mut p = Vec::with_capacity(HEADER + data.len());
            p.extend_from_slice(MAGIC);
            p.push(VERSION);
            p.push(k);
            p.extend_from_slice(&id);
            p.extend_from_slice(&(i as u16).to_le_bytes());
            p.extend_from_slice(&(total as u16).to_le_bytes());
            p.extend_from_slice(data);
            p
        })
        .collect())
}

/// Parses one part payload.
pub fn parse_part(b: &[u8]) -> Result<Part, QrError> {
    if b.len() < HEADER || &b[..2] != MAGIC || b[2] != VERSION {
        return Err(QrError::Foreign);
    }
    let kind = match b[3] {
        1 => Kind::Request,
        2 => Kind::Payment,
        _ => return Err(QrError::Foreign),
    };
    let mut id = [0u8; 8];
    id.copy_from_slice(&b[4..12]);
    let index = u16::from_le_bytes([b[12], b[13]]) as usize;
    let total = u16::from_le_bytes([b[14], b[15]]) as usize;
    if total == 0 || total > MAX_PARTS || index >= total {
        return Err(QrError::Foreign);
    }
    Ok(Part {
        kind,
        id,
        index,
        total,
        data: b[HEADER..].to_vec(),
    })
}

/// Reassembles a message from parts given in any order (duplicates allowed).
pub fn join(parts: &[Part]) -> Result<(Kind, Vec<u8>), QrError> {
    let first = parts.first().ok_or(QrError::NoCode)?;
    let mut by_index: BTreeMap<usize, &Part> = BTreeMap::new();
    for p in parts {
        if p.kind != first.kind || p.id != first.id || p.total != first.total {
            return Err(QrError::Mixed);
        }
        if let Some(prev) = by_index.insert(p.index, p) {
            if prev.data != p.data {
                return Err(QrError::Conflict(p.index));
            }
        }
    }
    if by_index.len() != first.total {
        return Err(QrError::Incomplete {
            have: by_index.len(),
            total: first.total,
        });
    }
    let msg: Vec<u8> = by_index
        .values()
        .flat_map(|p| p.data.iter().copied())
        .collect();
    let digest = hash("florin/qr/message/v1", &[&msg]);
    if digest[..8] != first.id {
        return Err(QrError::Mixed);
    }
    Ok((first.kind, msg))
}

/// Renders one part as a greyscale bitmap: (side in pixels, pixels; 0 = dark).
fn render(payload: &[u8]) -> Result<(usize, Vec<u8>), QrError> {
    let code = QrCode::with_error_correction_level(payload, EcLevel::M)
        .map_err(|e| QrError::Image(format!("QR encoding: {e}")))?;
    let w = code.width();
    let colors = code.to_colors();
    let side = (w + 2 * QUIET) * SCALE;
    let mut px = vec![255u8; side * side];
    for y in 0..w {
        for x in 0..w {
            if colors[y * w + x] == Color::Dark {
                for dy in 0..SCALE {
                    let row = ((y + QUIET) * SCALE + dy) * side;
                    let col = (x + QUIET) * SCALE;
                    px[row + col..row + col + SCALE].fill(0);
                }
            }
        }
    }
    Ok((side, px))
}

/// Encodes a message as PNG images, one per part.
pub fn to_pngs(kind: Kind, msg: &[u8]) -> Result<Vec<Vec<u8>>, QrError> {
    split(kind, msg)?
        .iter()
        .map(|p| {
            let (side, px) = render(p)?;
            let mut out = Vec::new();
            let mut enc = png::Encoder::new(&mut out, side as u32, side as u32);
            enc.set_color(png::ColorType::Grayscale);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc
                .write_header()
                .map_err(|e| QrError::Image(e.to_string()))?;
            w.write_image_data(&px)
                .map_err(|e| QrError::Image(e.to_string()))?;
            w.finish().map_err(|e| QrError::Image(e.to_string()))?;
            Ok(out)
        })
        .collect()
}

/// Encodes a message as one animated GIF cycling through its parts (two frames a second).
pub fn to_gif(kind: Kind, msg: &[u8]) -> Result<Vec<u8>, QrError> {
    let parts = split(kind, msg)?;
    let frames: Vec<(usize, Vec<u8>)> =
        parts.iter().map(|p| render(p)).collect::<Result<_, _>>()?;
    let side = frames.iter().map(|f| f.0).max().unwrap_or(0);
    let side16 = u16::try_from(side).map_err(|_| QrError::TooLarge(msg.len()))?;
    let mut out = Vec::new();
    {
        let mut enc = gif::Encoder::new(&mut out, side16, side16, &[0, 0, 0, 255, 255, 255])
            .map_err(|e| QrError::Image(e.to_string()))?;
        enc.set_repeat(gif::Repeat::Infinite)
            .map_err(|e| QrError::Image(e.to_string()))?;
        for (s, px) in frames {
            // Centre smaller codes on a white frame; palette index 0 = black, 1 = white.
            let pad = (side - s) / 2;
            let mut idx = vec![1u8; side * side];
            for y in 0..s {
                for x in 0..s {
                    idx[(y + pad) * side + x + pad] = u8::from(px[y * s + x] != 0);
                }
            }
            let mut f = gif::Frame::from_indexed_pixels(side16, side16, idx, None);
            f.delay = 50;
            enc.write_frame(&f)
                .map_err(|e| QrError::Image(e.to_string()))?;
        }
    }
    Ok(out)
}

fn decode_luma(w: usize, h: usize, luma: &[u8]) -> Result<Part, QrError> {
    if w == 0 || h == 0 || w.saturating_mul(h) > MAX_PIXELS || luma.len() < w * h {
        return Err(QrError::Image("image size out of range".into()));
    }
    // rqrr asserts on some crafted geometries: a panic there is an unreadable image, not a
    // crash.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut img = rqrr::PreparedImage::prepare_from_greyscale(w, h, |x, y| luma[y * w + x]);
        let mut found = Err(QrError::NoCode);
        for grid in img.detect_grids() {
            let mut bytes = Vec::new();
            if grid.decode_to(&mut bytes).is_ok() {
                found = parse_part(&bytes);
                if found.is_ok() {
                    break;
                }
            }
        }
        found
    }))
    .unwrap_or(Err(QrError::NoCode))
}

/// Reads the Florin parts in an image: one from a PNG, one per frame from a GIF.
pub fn read_image(bytes: &[u8]) -> Result<Vec<Part>, QrError> {
    if bytes.starts_with(b"GIF8") {
        let mut opts = gif::DecodeOptions::new();
        opts.set_color_output(gif::ColorOutput::RGBA);
        let mut dec = opts
            .read_info(Cursor::new(bytes))
            .map_err(|e| QrError::Image(e.to_string()))?;
        let mut parts = Vec::new();
        let mut frames = 0usize;
        while let Some(f) = dec
            .read_next_frame()
            .map_err(|e| QrError::Image(e.to_string()))?
        {
            // Frames that do not scan are bounded too: no image makes this decode for long.
            frames += 1;
            if frames > 4 * MAX_PARTS {
                return Err(QrError::TooLarge(bytes.len()));
            }
            let (w, h) = (f.width as usize, f.height as usize);
            let luma: Vec<u8> = f.buffer.chunks(4).map(|p| p[1]).collect();
            // A frame that does not scan is skipped; missing parts are named when joining.
            if let Ok(p) = decode_luma(w, h, &luma) {
                parts.push(p);
            }
            if parts.len() > MAX_PARTS {
                return Err(QrError::TooLarge(bytes.len()));
            }
        }
        if parts.is_empty() {
            return Err(QrError::NoCode);
        }
        return Ok(parts);
    }
    let mut dec = png::Decoder::new(Cursor::new(bytes));
    dec.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = dec.read_info().map_err(|e| QrError::Image(e.to_string()))?;
    let info = reader.info();
    let (w, h) = (info.width as usize, info.height as usize);
    if w.saturating_mul(h) > MAX_PIXELS {
        return Err(QrError::Image("image too large".into()));
    }
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| QrError::Image("image too large".into()))?;
    let mut buf = vec![0u8; size];
    let out = reader
        .next_frame(&mut buf)
        .map_err(|e| QrError::Image(e.to_string()))?;
    let channels = out.color_type.samples();
    let luma: Vec<u8> = buf[..out.buffer_size()]
        .chunks(out.line_size)
        .flat_map(|row| {
            row.chunks(channels)
                .take(w)
                .map(|p| if channels >= 3 { p[1] } else { p[0] })
        })
        .collect();
    Ok(vec![decode_luma(w, h, &luma)?])
}
