//! The run thread: each run's protocol session lives on its own thread (the library's
//! state machine is not `Send`) and is stepped through a channel.

use super::*;

/// What a run's thread hands back when the run ends.
pub(super) enum Out {
    Aux(Zeroizing<Vec<u8>>),
    Key(CoreShare),
    Presig(Box<Presignature>, PresigPublic),
    Sig([u8; 64]),
    DklsKey(Box<DklsShare>),
}

pub(super) type StepResult = Result<(Vec<WireMsg>, Option<Out>), CustodyError>;
pub(super) type Cmd = (Vec<WireMsg>, mpsc::SyncSender<StepResult>);

/// What a run's thread needs to build its session (all `Send`).
pub(super) enum Spec {
    Aux {
        primes: Zeroizing<Vec<u8>>,
    },
    Keygen {
        t: u16,
    },
    Presign(SignSpec),
    Sign(SignSpec, Vec<u8>),
    DklsKeygen {
        t: u16,
    },
    DklsSign {
        share: Zeroizing<Vec<u8>>,
        signers: Vec<PartyId>,
        message: Vec<u8>,
        /// Sign as the note key `key + tweak·G`.
        tweak: Option<[u8; 32]>,
    },
    DklsRefresh {
        share: Zeroizing<Vec<u8>>,
        /// The complete refresh (new OT set-up), not the fast one.
        complete: bool,
    },
}

/// A stored DKLs23 share (see [`AnyShare::to_stored`]).
fn dkls_share(stored: &[u8]) -> Result<DklsShare, CustodyError> {
    match AnyShare::from_stored(stored)? {
        AnyShare::Dkls(d) => Ok(*d),
        AnyShare::Cggmp(_) => Err(CustodyError::BadParameters(
            "a CGGMP24 key in a DKLs23 run".into(),
        )),
    }
}

pub(super) struct SignSpec {
    pub(super) signers: Vec<PartyId>,
    pub(super) core: Zeroizing<Vec<u8>>,
    pub(super) aux: Arc<Zeroizing<Vec<u8>>>,
}

/// A run's session, whatever its output.
enum AnySession<L: SecurityLevel> {
    Aux(Session<AuxShare<L>>),
    Key(Session<CoreShare>),
    Presig(Session<(Presignature, PresigPublic)>),
    Sig(Session<[u8; 64]>),
    DklsKey(Session<DklsShare>),
}

impl<L: SecurityLevel> AnySession<L> {
    fn build(eid: [u8; 32], me: PartyId, n: u16, spec: Spec) -> Result<Self, CustodyError> {
        let share = |s: &SignSpec| {
            ecdsa::KeyShare::<L>::from_parts(
                CoreShare::from_bytes(&s.core)?,
                AuxShare::<L>::from_bytes(&s.aux)?,
            )
        };
        Ok(match spec {
            Spec::Aux { primes } => AnySession::Aux(ecdsa::aux_session::<L>(
                eid,
                me,
                n,
                Primes::<L>::from_bytes(&primes)?,
            )?),
            Spec::Keygen { t } => AnySession::Key(ecdsa::keygen_session::<L>(eid, me, n, t)?),
            Spec::Presign(s) => {
                let ks = share(&s)?;
                AnySession::Presig(ecdsa::presign_session(eid, &s.signers, ks)?)
            }
            Spec::Sign(s, message) => {
                let ks = share(&s)?;
                AnySession::Sig(ecdsa::sign_session(eid, &s.signers, ks, &message)?)
            }
            Spec::DklsKeygen { t } => AnySession::DklsKey(dkls::keygen_session(eid, me, n, t)?),
            Spec::DklsSign {
                share,
                signers,
                message,
                tweak,
            } => {
                let share = dkls_share(&share)?;
                let share = match tweak {
                    Some(t) => dkls::add_key(&share, &t)?,
                    None => share,
                };
                AnySession::Sig(dkls::sign_session(eid, &signers, share, &message)?)
            }
            Spec::DklsRefresh {
                share,
                complete: false,
            } => AnySession::DklsKey(dkls::refresh_session(eid, dkls_share(&share)?)?),
            Spec::DklsRefresh {
                share,
                complete: true,
            } => AnySession::DklsKey(dkls::complete_refresh_session(eid, dkls_share(&share)?)?),
        })
    }

    fn step(&mut self, incoming: Vec<WireMsg>) -> StepResult {
        Ok(match self {
            AnySession::Aux(s) => {
                let st = s.step(incoming)?;
                (
                    st.out,
                    st.done.map(|a| Out::Aux(Zeroizing::new(a.to_bytes()))),
                )
            }
            AnySession::Key(s) => {
                let st = s.step(incoming)?;
                (st.out, st.done.map(Out::Key))
            }
            AnySession::Presig(s) => {
                let st = s.step(incoming)?;
                (st.out, st.done.map(|(p, q)| Out::Presig(Box::new(p), q)))
            }
            AnySession::Sig(s) => {
                let st = s.step(incoming)?;
                (st.out, st.done.map(Out::Sig))
            }
            AnySession::DklsKey(s) => {
                let st = s.step(incoming)?;
                (st.out, st.done.map(|d| Out::DklsKey(Box::new(d))))
            }
        })
    }
}

pub(super) fn spawn_run(
    level: EcdsaLevel,
    eid: [u8; 32],
    me: PartyId,
    n: u16,
    spec: Spec,
) -> Result<mpsc::Sender<Cmd>, CustodyError> {
    let (tx, rx) = mpsc::channel::<Cmd>();
    let spawned = thread::Builder::new()
        .name("ecdsa-run".into())
        .spawn(move || match level {
            // A DKLs23 run does not depend on the CGGMP24 level.
            EcdsaLevel::Production | EcdsaLevel::Dkls23 => {
                run_thread::<Production>(eid, me, n, spec, rx)
            }
            EcdsaLevel::InsecureTest => run_thread::<InsecureTest>(eid, me, n, spec, rx),
        });
    spawned.map_err(|e| CustodyError::Ecdsa(format!("cannot start a run: {e}")))?;
    Ok(tx)
}

/// One run: builds the session on this thread, then steps it once per command until it ends,
/// fails, or its node forgets it (the sender is dropped) or stops stepping it.
fn run_thread<L: SecurityLevel>(
    eid: [u8; 32],
    me: PartyId,
    n: u16,
    spec: Spec,
    rx: mpsc::Receiver<Cmd>,
) {
    let mut session = match AnySession::<L>::build(eid, me, n, spec) {
        Ok(s) => s,
        Err(e) => {
            if let Ok((_, reply)) = rx.recv_timeout(RUN_IDLE) {
                let _ = reply.send(Err(e));
            }
            return;
        }
    };
    while let Ok((incoming, reply)) = rx.recv_timeout(RUN_IDLE) {
        let r = session.step(incoming);
        let end = !matches!(r, Ok((_, None)));
        let _ = reply.send(r);
        if end {
            return;
        }
    }
}
