//! Small summary statistics shared by the benchmarks, the app's measuring mode and the
//! comparison tables.

/// The `q`-quantile (nearest rank) of `v`; NaN when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// Mean and unbiased standard deviation (0 for one value, NaN for none).
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / n;
    let s = if v.len() > 1 {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_values() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.9), 5.0);
        assert!(median(&[]).is_nan());
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert_eq!((m, s), (2.0, 1.0));
    }
}
