//! The thesis prototype's own library, measured in the same run: libsodium's
//! `crypto_sign_verify_detached`, loaded at run time so the `florin` binary does not depend on
//! it (Debian: `libsodium23`).
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_uchar, c_ulonglong};

type SodiumInit = unsafe extern "C" fn() -> c_int;
type VerifyDetached =
    unsafe extern "C" fn(*const c_uchar, *const c_uchar, c_ulonglong, *const c_uchar) -> c_int;
type SignDetached = unsafe extern "C" fn(
    *mut c_uchar,
    *mut c_ulonglong,
    *const c_uchar,
    c_ulonglong,
    *const c_uchar,
) -> c_int;
type SeedKeypair = unsafe extern "C" fn(*mut c_uchar, *mut c_uchar, *const c_uchar) -> c_int;

/// A loaded libsodium.
pub struct Sodium {
    _lib: libloading::Library,
    verify: VerifyDetached,
    sign: SignDetached,
    keypair: SeedKeypair,
}

impl Sodium {
    /// Loads libsodium, or explains why not.
    pub fn load() -> Result<Sodium, String> {
        let mut last = String::new();
        for name in [
            "libsodium.so.23",
            "libsodium.so.26",
            "libsodium.so",
            "libsodium.dylib",
        ] {
            // SAFETY: loading a well-known system library whose initialisers are benign.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    // SAFETY: the symbol types match libsodium's documented C signatures.
                    let (init, verify, sign, keypair) = unsafe {
                        let init: libloading::Symbol<SodiumInit> =
                            lib.get(b"sodium_init\0").map_err(|e| e.to_string())?;
                        let verify: libloading::Symbol<VerifyDetached> = lib
                            .get(b"crypto_sign_verify_detached\0")
                            .map_err(|e| e.to_string())?;
                        let sign: libloading::Symbol<SignDetached> = lib
                            .get(b"crypto_sign_detached\0")
                            .map_err(|e| e.to_string())?;
                        let keypair: libloading::Symbol<SeedKeypair> = lib
                            .get(b"crypto_sign_seed_keypair\0")
                            .map_err(|e| e.to_string())?;
                        (*init, *verify, *sign, *keypair)
                    };
                    // SAFETY: sodium_init takes no arguments and may be called repeatedly.
                    if unsafe { init() } < 0 {
                        return Err("sodium_init failed".into());
                    }
                    return Ok(Sodium {
                        _lib: lib,
                        verify,
                        sign,
                        keypair,
                    });
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!(
            "libsodium not found ({last}); install Debian's libsodium23"
        ))
    }

    /// Verifies one detached signature.
    pub fn verify(&self, sig: &[u8; 64], msg: &[u8], key: &[u8; 32]) -> bool {
        // SAFETY: pointers are valid for the given lengths for the duration of the call.
        unsafe {
            (self.verify)(
                sig.as_ptr(),
                msg.as_ptr(),
                msg.len() as c_ulonglong,
                key.as_ptr(),
            ) == 0
        }
    }

    /// libsodium's secret key (seed ‖ public key) and public key for a 32-byte seed.
    pub fn keypair(&self, seed: &[u8; 32]) -> Option<([u8; 64], [u8; 32])> {
        let (mut sk, mut pk) = ([0u8; 64], [0u8; 32]);
        // SAFETY: the buffers are as large as libsodium's documented sizes
        // (crypto_sign_PUBLICKEYBYTES = 32, crypto_sign_SECRETKEYBYTES = 64, seed 32).
        let rc = unsafe { (self.keypair)(pk.as_mut_ptr(), sk.as_mut_ptr(), seed.as_ptr()) };
        (rc == 0).then_some((sk, pk))
    }

    /// Signs `msg` (detached Ed25519); `None` if libsodium refuses or writes another length.
    pub fn sign(&self, sk: &[u8; 64], msg: &[u8]) -> Option<[u8; 64]> {
        let mut sig = [0u8; 64];
        let mut len: c_ulonglong = 0;
        // SAFETY: pointers are valid for the given lengths for the duration of the call; the
        // signature buffer is crypto_sign_BYTES (64) long.
        let rc = unsafe {
            (self.sign)(
                sig.as_mut_ptr(),
                &mut len,
                msg.as_ptr(),
                msg.len() as c_ulonglong,
                sk.as_ptr(),
            )
        };
        (rc == 0 && len == 64).then_some(sig)
    }
}
