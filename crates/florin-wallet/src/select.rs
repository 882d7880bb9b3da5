//! Exact change: which tokens add up to an amount.

use florin_token::Denomination;

/// Chooses tokens summing exactly to `target` cents, preferring few tokens.
///
/// `available[i]` is the denomination of token `i`. Returns token indices, or `None` when no
/// subset sums to the target. The search is a bounded depth-first search over denomination
/// counts, largest first; with 15 denominations it finishes instantly in practice.
pub fn select_exact(available: &[Denomination], target: u64) -> Option<Vec<usize>> {
    let mut by_denom: Vec<(Denomination, Vec<usize>)> = Denomination::ALL
        .iter()
        .rev()
        .map(|d| (*d, Vec::new()))
        .collect();
    for (i, d) in available.iter().enumerate() {
        if let Some(slot) = by_denom.iter_mut().find(|(x, _)| x == d) {
            slot.1.push(i);
        }
    }
    by_denom.retain(|(_, v)| !v.is_empty());
    // suffix[i]: total value of denominations i.. (for pruning).
    let mut suffix = vec![0u64; by_denom.len() + 1];
    for i in (0..by_denom.len()).rev() {
        suffix[i] = suffix[i + 1] + by_denom[i].0.cents() * by_denom[i].1.len() as u64;
    }
    let mut counts = vec![0usize; by_denom.len()];
    let mut budget = 1_000_000u32;
    if !dfs(&by_denom, &suffix, 0, target, &mut counts, &mut budget) {
        return None;
    }
    Some(
        by_denom
            .iter()
            .zip(&counts)
            .flat_map(|((_, idx), &k)| idx.iter().take(k).copied())
            .collect(),
    )
}

fn dfs(
    by: &[(Denomination, Vec<usize>)],
    suffix: &[u64],
    i: usize,
    remaining: u64,
    counts: &mut [usize],
    budget: &mut u32,
) -> bool {
    if remaining == 0 {
        return true;
    }
    if i == by.len() || suffix[i] < remaining || *budget == 0 {
        return false;
    }
    *budget -= 1;
    let value = by[i].0.cents();
    let max = (remaining / value).min(by[i].1.len() as u64) as usize;
    for k in (0..=max).rev() {
        counts[i] = k;
        if dfs(
            by,
            suffix,
            i + 1,
            remaining - value * k as u64,
            counts,
            budget,
        ) {
            return true;
        }
    }
    counts[i] = 0;
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use Denomination::*;

    fn sum(av: &[Denomination], idx: &[usize]) -> u64 {
        idx.iter().map(|&i| av[i].cents()).sum()
    }

    #[test]
    fn finds_exact_change_where_greedy_fails() {
        let av = [E50, E20, E20, E20];
        let idx = select_exact(&av, 6000).unwrap();
        assert_eq!(sum(&av, &idx), 6000);
        assert_eq!(idx.len(), 3);
    }

    #[test]
    fn reports_impossible() {
        assert_eq!(select_exact(&[E5, E5], 700), None);
        assert_eq!(select_exact(&[], 1), None);
        assert_eq!(select_exact(&[E1], 0), Some(vec![]));
    }

    #[test]
    fn prefers_few_tokens() {
        let mut av = vec![C1; 500];
        av.push(E5);
        let idx = select_exact(&av, 500).unwrap();
        assert_eq!(idx, vec![500]);
    }
}
