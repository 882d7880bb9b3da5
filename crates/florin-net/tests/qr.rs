//! QR codes: encode → PNG/GIF → decode → reassemble.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use florin_net::qr::{join, read_image, split, to_gif, to_pngs, Kind, QrError, PART_BYTES};

#[test]
fn one_part_round_trips_through_png() {
    let msg = b"a payment request of 75 bytes, more or less, for the test".to_vec();
    let pngs = to_pngs(Kind::Request, &msg).unwrap();
    assert_eq!(pngs.len(), 1);
    let parts = read_image(&pngs[0]).unwrap();
    assert_eq!(join(&parts).unwrap(), (Kind::Request, msg));
}

#[test]
fn many_parts_reassemble_in_any_order_from_pngs_and_a_gif() {
    let msg: Vec<u8> = (0..(PART_BYTES * 3 + 17) as u32)
        .map(|i| (i * 7 % 256) as u8)
        .collect();
    let pngs = to_pngs(Kind::Payment, &msg).unwrap();
    assert_eq!(pngs.len(), 4);
    let mut parts: Vec<_> = pngs
        .iter()
        .rev()
        .flat_map(|p| read_image(p).unwrap())
        .collect();
    // A part scanned twice is fine.
    parts.push(parts[1].clone());
    assert_eq!(join(&parts).unwrap(), (Kind::Payment, msg.clone()));
    // A missing part is named.
    assert!(matches!(
        join(&parts[..2]),
        Err(QrError::Incomplete { have: 2, total: 4 })
    ));
    let gif = to_gif(Kind::Payment, &msg).unwrap();
    let frames = read_image(&gif).unwrap();
    assert_eq!(frames.len(), 4);
    assert_eq!(join(&frames).unwrap().1, msg);
}

#[test]
fn foreign_and_mixed_codes_are_refused() {
    let a = split(Kind::Payment, &vec![1u8; PART_BYTES + 1]).unwrap();
    let b = split(Kind::Payment, &vec![2u8; PART_BYTES + 1]).unwrap();
    let pa = florin_net::qr::parse_part(&a[0]).unwrap();
    let pb = florin_net::qr::parse_part(&b[1]).unwrap();
    assert!(matches!(join(&[pa, pb]), Err(QrError::Mixed)));
    assert!(matches!(
        florin_net::qr::parse_part(b"hello"),
        Err(QrError::Foreign)
    ));
    // An ordinary QR code (not a Florin part), and bytes that are no image at all.
    let code = qrcode::QrCode::new(b"https://example.invalid").unwrap();
    let w = code.width();
    let colors = code.to_colors();
    let side = (w + 8) * 4;
    let mut px = vec![255u8; side * side];
    for y in 0..side {
        for x in 0..side {
            let (mx, my) = ((x / 4) as isize - 4, (y / 4) as isize - 4);
            if mx >= 0
                && my >= 0
                && (mx as usize) < w
                && (my as usize) < w
                && colors[my as usize * w + mx as usize] == qrcode::Color::Dark
            {
                px[y * side + x] = 0;
            }
        }
    }
    let mut png_bytes = Vec::new();
    let mut enc = png::Encoder::new(&mut png_bytes, side as u32, side as u32);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(&px).unwrap();
    assert!(matches!(read_image(&png_bytes), Err(QrError::Foreign)));
    assert!(matches!(
        read_image(b"not an image"),
        Err(QrError::Image(_))
    ));
}
