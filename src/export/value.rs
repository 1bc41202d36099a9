//! A framework setting's value, written in the three syntaxes the exports use (a Python
//! literal for TRL, a Hydra override for verl, a command-line flag for OpenRLHF) and read
//! back from them (the round-trip tests).

/// One value of a framework key.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    /// Python's `None`, YAML's `null`.
    None,
    List(Vec<Val>),
    /// A value the exported script decides where it runs: the name of a variable it defines
    /// (TRL's `bf16=BF16`, with `BF16` true where the GPU supports bf16). Python only; an
    /// all-caps name, which no literal of the three syntaxes is.
    Expr(&'static str),
}

impl Val {
    pub fn str(s: impl Into<String>) -> Self {
        Val::Str(s.into())
    }
    pub fn int(i: usize) -> Self {
        Val::Int(i as i64)
    }

    /// A Python literal (`GRPOConfig(key=...)`).
    pub fn python(&self) -> String {
        match self {
            Val::Int(i) => i.to_string(),
            Val::Float(x) => float(*x),
            Val::Str(s) => serde_json::to_string(s).expect("a string serializes"),
            Val::Bool(true) => "True".into(),
            Val::Bool(false) => "False".into(),
            Val::None => "None".into(),
            Val::List(v) => format!(
                "[{}]",
                v.iter().map(Val::python).collect::<Vec<_>>().join(", ")
            ),
            Val::Expr(name) => name.to_string(),
        }
    }

    /// A Hydra override's right-hand side (`key=...`), quoted where Hydra's grammar needs it.
    pub fn hydra(&self) -> String {
        match self {
            Val::Int(i) => i.to_string(),
            Val::Float(x) => float(*x),
            Val::Str(s) => {
                let plain = !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-./$:{}".contains(c))
                    && s.parse::<f64>().is_err()
                    && !matches!(s.as_str(), "true" | "false" | "null");
                if plain {
                    s.clone()
                } else {
                    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
                }
            }
            Val::Bool(b) => b.to_string(),
            Val::None => "null".into(),
            Val::List(v) => format!(
                "[{}]",
                v.iter().map(Val::hydra).collect::<Vec<_>>().join(",")
            ),
            Val::Expr(name) => name.to_string(),
        }
    }

    /// A command-line flag's arguments (`--key a b`): lists as separate words.
    pub fn cli(&self) -> String {
        match self {
            Val::List(v) => v.iter().map(Val::cli).collect::<Vec<_>>().join(" "),
            Val::Str(s)
                if s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./:".contains(c)) =>
            {
                s.clone()
            }
            Val::Str(s) => single_quoted(s),
            other => other.hydra(),
        }
    }

    /// Read back what [`Val::python`] or [`Val::hydra`] wrote.
    pub fn parse_literal(text: &str) -> Option<Val> {
        let (v, rest) = parse_one(text.trim())?;
        rest.trim().is_empty().then_some(v)
    }

    /// Read back what [`Val::python`] wrote, where an all-caps name is one of the script's
    /// own variables (`names`: the [`Val::Expr`]s it may hold).
    pub fn parse_python(text: &str, names: &[&'static str]) -> Option<Val> {
        let name = names.iter().copied().find(|n| *n == text.trim());
        name.map(Val::Expr).or_else(|| Self::parse_literal(text))
    }
}

/// `s` in bash's single quotes, a `'` inside as `'\''` (one word, nothing expanded).
pub fn single_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A float with a `.` in its mantissa (`1.0e-8`, not `1e-8`): YAML 1.1 (PyYAML) reads
/// `1e-8` as a string, Python and Hydra read both.
pub fn float(x: f64) -> String {
    let s = format!("{x:?}");
    match s.find('e') {
        Some(i) if !s[..i].contains('.') => format!("{}.0{}", &s[..i], &s[i..]),
        _ => s,
    }
}

fn parse_one(s: &str) -> Option<(Val, &str)> {
    let s = s.trim_start();
    if let Some(rest) = s.strip_prefix('[') {
        let mut items = Vec::new();
        let mut rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix(']') {
            return Some((Val::List(items), r));
        }
        loop {
            let (v, r) = parse_one(rest)?;
            items.push(v);
            let r = r.trim_start();
            if let Some(r) = r.strip_prefix(',') {
                rest = r;
            } else {
                return Some((Val::List(items), r.strip_prefix(']')?));
            }
        }
    }
    if s.starts_with('"') {
        // A JSON string (what `python` writes).
        let mut de = serde_json::Deserializer::from_str(s).into_iter::<String>();
        let v = de.next()?.ok()?;
        let used = de.byte_offset();
        return Some((Val::Str(v), &s[used..]));
    }
    if let Some(body) = s.strip_prefix('\'') {
        let mut out = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => out.push(chars.next()?.1),
                '\'' => return Some((Val::Str(out), &body[i + 1..])),
                c => out.push(c),
            }
        }
        return None;
    }
    let end = s.find([',', ']']).unwrap_or(s.len());
    let (word, rest) = (s[..end].trim(), &s[end..]);
    let v = match word {
        "True" | "true" => Val::Bool(true),
        "False" | "false" => Val::Bool(false),
        "None" | "null" => Val::None,
        w => {
            if let Ok(i) = w.parse::<i64>() {
                Val::Int(i)
            } else if let Ok(x) = w.parse::<f64>() {
                Val::Float(x)
            } else {
                Val::Str(w.to_string())
            }
        }
    };
    Some((v, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_round_trip_in_both_syntaxes() {
        let vals = [
            Val::Int(-3),
            Val::Float(1e-8),
            Val::Float(0.04),
            Val::Float(1.0),
            Val::Float(1e9),
            Val::str("kl-beta"),
            Val::str("it's \"quoted\""),
            Val::Bool(true),
            Val::None,
            Val::List(vec![Val::Float(0.9), Val::Float(0.999)]),
            Val::List(vec![]),
        ];
        for v in vals {
            assert_eq!(Val::parse_literal(&v.python()), Some(v.clone()), "{v:?}");
            assert_eq!(Val::parse_literal(&v.hydra()), Some(v.clone()), "{v:?}");
        }
        assert_eq!(float(1e-8), "1.0e-8");
        assert_eq!(float(0.001), "0.001");
    }
}
