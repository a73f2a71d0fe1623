//! The machine's online CPUs (`/sys/devices/system/cpu/online`): what the
//! perf backend opens per-CPU events on and what `GetCapabilities` counts.
//! One reader for the whole daemon; no backend owns it.

/// The online CPUs, lowest first (CPU 0 alone when the list cannot be read).
pub fn online() -> Vec<u32> {
    let text =
        std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_else(|_| "0".into());
    parse(&text)
}

/// A kernel CPU list (`cpulist` format: `0-3,6`), at least CPU 0.
fn parse(list: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<u32>().ok()),
        }
    }
    if v.is_empty() {
        v.push(0);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse("0\n"), [0]);
        assert_eq!(parse("0-3,6\n"), [0, 1, 2, 3, 6]);
        assert_eq!(parse("1,3-4"), [1, 3, 4]);
        assert_eq!(parse(""), [0], "unreadable: CPU 0");
        assert_eq!(parse("x-y"), [0]);
        assert!(!online().is_empty());
    }
}
