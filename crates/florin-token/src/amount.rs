//! Euro amounts as users type them: `12.50`, `12.5`, `12`, `0.05`.

use thiserror::Error;

/// Why a string is not an amount.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AmountError {
    /// Not digits with an optional decimal point.
    #[error("{0:?} is not a euro amount (expected e.g. 12.50)")]
    Syntax(String),
    /// More than two decimals.
    #[error("{0:?} has more than two decimals (the smallest unit is one cent)")]
    TooPrecise(String),
    /// Larger than the system can count.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Parses a euro amount into cents.
pub fn parse_euros(s: &str) -> Result<u64, AmountError> {
    let t = s.trim().trim_start_matches('€');
    let (whole, frac) = match t.split_once('.') {
        Some((w, f)) => (w, f),
        None => (t, ""),
    };
    let digits = |x: &str| x.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && frac.is_empty() || !digits(whole) || !digits(frac) {
        return Err(AmountError::Syntax(s.to_string()));
    }
    if t.contains('.') && frac.is_empty() {
        return Err(AmountError::Syntax(s.to_string()));
    }
    if frac.len() > 2 {
        return Err(AmountError::TooPrecise(s.to_string()));
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole
            .parse()
            .map_err(|_| AmountError::TooLarge(s.to_string()))?
    };
    let frac_cents: u64 = match frac.len() {
        0 => 0,
        1 => frac.parse::<u64>().unwrap_or(0) * 10,
        _ => frac.parse::<u64>().unwrap_or(0),
    };
    whole
        .checked_mul(100)
        .and_then(|c| c.checked_add(frac_cents))
        .ok_or_else(|| AmountError::TooLarge(s.to_string()))
}

/// Formats cents as `12.50`.
pub fn format_cents(cents: u64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_user_amounts() {
        assert_eq!(parse_euros("12.50"), Ok(1250));
        assert_eq!(parse_euros("12.5"), Ok(1250));
        assert_eq!(parse_euros("12"), Ok(1200));
        assert_eq!(parse_euros("0.05"), Ok(5));
        assert_eq!(parse_euros(".05"), Ok(5));
        assert_eq!(parse_euros("€3"), Ok(300));
        for bad in ["", ".", "1.", "-1", "1,50", "abc", "1.2.3", "1e3"] {
            assert!(
                matches!(parse_euros(bad), Err(AmountError::Syntax(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_euros("1.234"),
            Err(AmountError::TooPrecise(_))
        ));
        assert!(matches!(
            parse_euros("999999999999999999999"),
            Err(AmountError::TooLarge(_))
        ));
        assert_eq!(format_cents(1250), "12.50");
        assert_eq!(format_cents(5), "0.05");
    }
}
