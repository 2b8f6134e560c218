//! The SVG sequence diagram of a counterexample: one vertical lane per participant, one row per
//! event in order; faults are bands across every lane, violating writes are red, recorded round
//! trips (what a worker really sent) are blue.

use super::{DiagramEvent, esc};
use std::fmt::Write as _;

const LANE_WIDTH: usize = 150;
const ROW_HEIGHT: usize = 24;
const TOP: usize = 48;

/// Renders the diagram as an inline `<svg>` element.
pub fn sequence_diagram(lanes: &[String], events: &[DiagramEvent]) -> String {
    let width = LANE_WIDTH * lanes.len().max(1);
    let height = TOP + ROW_HEIGHT * (events.len() + 1);
    let x = |lane: &str| {
        let index = lanes.iter().position(|l| l == lane).unwrap_or(0);
        LANE_WIDTH * index + LANE_WIDTH / 2
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"sequence-diagram\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    out.push_str("<defs><marker id=\"arrow\" markerWidth=\"8\" markerHeight=\"8\" refX=\"7\" refY=\"4\" orient=\"auto\"><path d=\"M0,0 L8,4 L0,8 z\" fill=\"#333\"/></marker><marker id=\"arrow-red\" markerWidth=\"8\" markerHeight=\"8\" refX=\"7\" refY=\"4\" orient=\"auto\"><path d=\"M0,0 L8,4 L0,8 z\" fill=\"#b00020\"/></marker></defs>\n");
    for lane in lanes {
        let cx = x(lane);
        let _ = writeln!(
            out,
            "<g class=\"lane\"><rect x=\"{}\" y=\"8\" width=\"{}\" height=\"22\" rx=\"4\" fill=\"#eef3fb\" stroke=\"#6a8bc4\"/><text x=\"{cx}\" y=\"23\" text-anchor=\"middle\">{}</text><line x1=\"{cx}\" y1=\"30\" x2=\"{cx}\" y2=\"{height}\" stroke=\"#bbb\" stroke-dasharray=\"4 3\"/></g>",
            cx - LANE_WIDTH / 2 + 6,
            LANE_WIDTH - 12,
            esc(lane)
        );
    }
    for (row, event) in events.iter().enumerate() {
        let y = TOP + ROW_HEIGHT * row + ROW_HEIGHT / 2;
        match event.kind.as_str() {
            "fault" => {
                let _ = writeln!(
                    out,
                    "<g class=\"fault\"><rect x=\"2\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff1d6\" stroke=\"#e69500\"/><text x=\"8\" y=\"{}\" fill=\"#8a5a00\">step {} FAULT {}</text></g>",
                    y - ROW_HEIGHT / 2 + 2,
                    width - 4,
                    ROW_HEIGHT - 4,
                    y + 4,
                    event.step,
                    esc(&event.label)
                );
            }
            kind => {
                let (x1, x2) = (x(&event.from), x(&event.to));
                let color = match kind {
                    "violation" => "#b00020",
                    "wire" => "#2a5db0",
                    _ => "#333",
                };
                let marker = if kind == "violation" {
                    "arrow-red"
                } else {
                    "arrow"
                };
                let class = match kind {
                    "violation" => "violation",
                    "wire" => "wire",
                    _ => "message",
                };
                if x1 == x2 {
                    let _ = writeln!(
                        out,
                        "<g class=\"{class}\"><circle cx=\"{x1}\" cy=\"{y}\" r=\"3\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\" fill=\"{color}\">{}</text></g>",
                        x1 + 6,
                        y + 4,
                        esc(&event.label)
                    );
                } else {
                    let label_x = x1.min(x2) + (x1.max(x2) - x1.min(x2)) / 2;
                    let _ = writeln!(
                        out,
                        "<g class=\"{class}\"><line x1=\"{x1}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"{color}\" stroke-width=\"{}\" marker-end=\"url(#{marker})\"/><text x=\"{label_x}\" y=\"{}\" text-anchor=\"middle\" fill=\"{color}\">{}</text></g>",
                        if kind == "violation" { 2 } else { 1 },
                        y - 3,
                        esc(&event.label)
                    );
                }
            }
        }
    }
    out.push_str("</svg>\n");
    out
}
