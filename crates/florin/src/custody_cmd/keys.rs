//! Key material the commands read and sign with: seeds, P-256 secrets, ECDSA signing.

use super::*;

/// Whether `key` is one of the network's ECDSA keys (key names are one namespace).
pub(super) fn is_ecdsa(kmn: &Kmn, key: &str) -> bool {
    kmn.status().iter().any(|s| {
        s.ecdsa
            .as_ref()
            .is_some_and(|e| e.keys.iter().any(|k| k.0 == key))
    })
}

/// `florin custody sign` with an ECDSA key: interactive, or from a fresh presignature.
pub(super) fn sign_p256(
    kmn: &Arc<Kmn>,
    key: &str,
    msg: &[u8],
    presigned: bool,
    json: bool,
) -> Result<ExitCode> {
    let signer = kmn.ecdsa_signer(key, 0)?;
    let dkls = signer.engine() == florin_node::custody::EcdsaEngine::Dkls23;
    if presigned && dkls {
        bail!("{key} is a DKLs23 key: it has no presignatures (it signs in three rounds)");
    }
    let presign_ms = if presigned {
        let st = Instant::now();
        signer.presign()?;
        Some(st.elapsed().as_secs_f64() * 1e3)
    } else {
        None
    };
    let st = Instant::now();
    let sig = signer.sign_msg(msg)?;
    let ms = st.elapsed().as_secs_f64() * 1e3;
    let pk = signer.public_key();
    let valid = florin_crypto::p256::verify(&pk, msg, &sig).is_ok();
    let mode = if presigned {
        "presignature"
    } else if dkls {
        "dkls23"
    } else {
        "interactive"
    };
    if json {
        print_json(&json!({
            "key": key, "scheme": "p256", "public_key": hex::encode(pk.0),
            "signature": hex::encode(sig.0), "valid": valid, "mode": mode,
            "ms": ms, "presign_ms": presign_ms,
        }));
    } else {
        println!("{}", hex::encode(sig.0));
        match presign_ms {
            Some(p) => tracing::info!(
                "verifies under p256:{}: {valid} (presignature {p:.1} ms, then signing {ms:.1} ms)",
                hex::encode(pk.0)
            ),
            None => tracing::info!(
                "verifies under p256:{}: {valid} (interactive, {ms:.1} ms)",
                hex::encode(pk.0)
            ),
        }
    }
    Ok(if valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A P-256 secret key file: 32 bytes hex, optionally prefixed as `export` prints it.
pub(super) fn read_p256_secret(path: &Path) -> Result<Zeroizing<[u8; 32]>> {
    let s = Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?,
    );
    let t = s.trim();
    let t = t.strip_prefix(P256_PREFIX).unwrap_or(t);
    let b = Zeroizing::new(
        hex::decode(t).with_context(|| format!("{}: not a hex P-256 secret", path.display()))?,
    );
    let k: [u8; 32] = b[..]
        .try_into()
        .map_err(|_| anyhow!("{}: not a 32-byte P-256 secret", path.display()))?;
    florin_crypto::p256::P256SecretKey::from_bytes(&k)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(Zeroizing::new(k))
}

/// A Florin key file's seed.
pub fn read_seed(path: &Path) -> Result<[u8; 32]> {
    let s =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if s.trim().starts_with(SCALAR_PREFIX) {
        bail!(
            "{} holds an exported signing scalar, not a key seed; it cannot be used as a key file",
            path.display()
        );
    }
    let b = hex::decode(s.trim()).with_context(|| format!("{}: not a key file", path.display()))?;
    b.try_into()
        .map_err(|_| anyhow!("{}: not a 32-byte key", path.display()))
}
