//! Share repair.

use super::*;

/// Checks a repair's party set: `helpers` distinct parties of the group, at least t of them,
/// `target` a party of the group that is not a helper.
fn check_repair(
    group: &GroupKey,
    helpers: &[PartyId],
    target: PartyId,
) -> Result<(), CustodyError> {
    let mut sorted = helpers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != helpers.len()
        || helpers.len() < group.t as usize
        || helpers.iter().any(|&h| h == 0 || h > group.n)
    {
        return Err(CustodyError::BadParameters(format!(
            "repair helpers {helpers:?}: at least {} distinct parties of {}",
            group.t, group.n
        )));
    }
    if target == 0 || target > group.n || helpers.contains(&target) {
        return Err(CustodyError::BadParameters(format!(
            "repair of party {target} by {helpers:?}"
        )));
    }
    Ok(())
}

/// Share repair, step 1, at each helper (the repairable threshold scheme of Laing and Stinson,
/// as `frost-core` implements it): splits this helper's Lagrange-weighted share into random
/// deltas, one per helper (this one included), that add up to it. Each delta is secret: seal
/// it to its helper. No helper, and not the coordinator, learns a share.
pub fn repair_deltas<R: RngCore + CryptoRng>(
    share: &KeyShare,
    helpers: &[PartyId],
    target: PartyId,
    rng: &mut R,
) -> Result<BTreeMap<PartyId, Zeroizing<Vec<u8>>>, CustodyError> {
    check_repair(&share.group, helpers, target)?;
    if !helpers.contains(&share.party) {
        return Err(CustodyError::BadParameters(format!(
            "party {} is not a helper of {helpers:?}",
            share.party
        )));
    }
    let ids = helpers
        .iter()
        .map(|&h| ident(h))
        .collect::<Result<Vec<_>, _>>()?;
    let deltas = frost_core::keys::repairable::repair_share_part1(
        &ids,
        &share.key_package,
        rng,
        ident(target)?,
    )
    .map_err(frost_err)?;
    Ok(deltas
        .iter()
        .map(|(id, d)| (party_of(id), Zeroizing::new(d.serialize())))
        .collect())
}

/// Decodes one value from each party; bytes that do not decode name their sender.
fn decode_each<T, E>(
    from: &BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
    what: &str,
    decode: impl Fn(&[u8]) -> Result<T, E>,
) -> Result<Vec<T>, CustodyError> {
    from.iter()
        .map(|(&p, bytes)| {
            decode(bytes).map_err(|_| CustodyError::Misbehaved {
                party: p,
                reason: format!("malformed {what}"),
            })
        })
        .collect()
}

/// Share repair, step 2, at each helper: adds the deltas addressed to it, one from every
/// helper, into its sigma for the target (secret: seal it to the target).
pub fn repair_sigma(
    deltas: &BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
) -> Result<Zeroizing<Vec<u8>>, CustodyError> {
    let list = decode_each(
        deltas,
        "repair delta",
        frost::keys::repairable::Delta::deserialize,
    )?;
    Ok(Zeroizing::new(
        frost::keys::repairable::repair_share_part2(&list).serialize(),
    ))
}

/// Share repair, step 3, at the target: adds every helper's sigma into the lost share and
/// checks it against the group's public share for the target, so a wrong value from any
/// helper fails the repair instead of storing a share that cannot sign.
pub fn repair_finish(
    group: &GroupKey,
    target: PartyId,
    sigmas: &BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
) -> Result<KeyShare, CustodyError> {
    let helpers: Vec<PartyId> = sigmas.keys().copied().collect();
    check_repair(group, &helpers, target)?;
    let list = decode_each(
        sigmas,
        "repair sigma",
        frost::keys::repairable::Sigma::deserialize,
    )?;
    let id = ident(target)?;
    let key_package = frost::keys::repairable::repair_share_part3(&list, id, &group.package)
        .map_err(frost_err)?;
    let expected = group
        .package
        .verifying_shares()
        .get(&id)
        .ok_or_else(|| CustodyError::malformed("group key"))?;
    if &frost::keys::VerifyingShare::from(*key_package.signing_share()) != expected {
        return Err(CustodyError::Inconsistent(format!(
            "the repaired share does not match party {target}'s public share: a helper sent a wrong value"
        )));
    }
    Ok(KeyShare {
        party: target,
        key_package,
        group: group.clone(),
    })
}
