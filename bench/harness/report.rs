//! A figure's row (ours, the baseline, the ratio, the target and whether it
//! was met) and the report: a table, or `--json`.

use serde_json::{Value, json};

pub(crate) struct Row {
    pub(crate) figure: &'static str,
    pub(crate) ours: String,
    pub(crate) baseline: String,
    pub(crate) ratio: String,
    pub(crate) target: &'static str,
    pub(crate) met: Option<bool>,
    pub(crate) reference: String,
}

impl Row {
    /// A figure printed next to its baseline, with no target.
    pub(crate) fn reported(
        figure: &'static str,
        ours: String,
        baseline: String,
        ratio: String,
    ) -> Row {
        Row {
            figure,
            ours,
            baseline,
            ratio,
            target: "(reported)",
            met: None,
            reference: String::new(),
        }
    }
}

/// The leading number of a figure ("1.743 ms" → 1.743, "1,219 MB/s" →
/// 1219).
fn leading_number(s: &str) -> Option<f64> {
    let n: String = s
        .trim_start_matches(['+', ' '])
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',' || *c == '-')
        .filter(|c| *c != ',')
        .collect();
    n.parse().ok()
}

/// The figures, as a table or (`--json`) one JSON array.
pub(crate) fn report(rows: &[Row], with_ref: bool, as_json: bool) {
    if !as_json {
        print_rows(rows, with_ref);
        return;
    }
    let out: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "figure": r.figure, "ours": r.ours, "baseline": r.baseline,
                "ratio": r.ratio, "target": r.target, "met": r.met,
                "reference": (!r.reference.is_empty()).then_some(&r.reference),
                "ours_value": leading_number(&r.ours),
                "baseline_value": leading_number(&r.baseline),
            })
        })
        .collect();
    println!("{}", Value::Array(out));
}

fn print_rows(rows: &[Row], with_ref: bool) {
    println!(
        "{:<44} {:>16} {:>22} {:>8} {:<28} {:>4}{}",
        "figure",
        "exec-gateway",
        "baseline",
        "ratio",
        "target",
        "met",
        if with_ref {
            "   reference (codex 0.130.0)"
        } else {
            ""
        }
    );
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        println!(
            "{:<44} {:>16} {:>22} {:>8} {:<28} {:>4}{}",
            r.figure,
            r.ours,
            r.baseline,
            r.ratio,
            r.target,
            met,
            if with_ref {
                format!("   {}", r.reference)
            } else {
                String::new()
            }
        );
    }
}
