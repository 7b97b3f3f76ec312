//! Values of the filter flags: sizes (`--min-size`, `--max-size`) and ages
//! or dates (`--min-age`, `--max-age`, and the age of `cleanup --max-age`).

use std::time::Duration;

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::Timestamp;

/// A size in bytes: `100`, `512K`, `10M`, `1.5G`, `2T` (powers of 1024).
/// Returns `String`: clap's `value_parser` contract (the message is its usage error).
pub fn parse_size(s: &str) -> Result<u64, String> {
    ferry_engine::filter::parse_size(s)
}

/// A duration: a number and a unit, possibly several (`1h30m`): `ms`, `s`,
/// `m`, `h`, `d`, `w`, `M` (30 days), `y` (365 days); fractions allowed
/// (`1.5h`); a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?}: not a duration (e.g. 90, 30s, 10m, 2h, 7d, 2w)");
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    if t.is_empty() {
        return Err(bad());
    }
    let mut rest = t;
    let mut secs = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let v: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            "w" => 7.0 * 86_400.0,
            "M" => 30.0 * 86_400.0,
            "y" => 365.0 * 86_400.0,
            _ => return Err(bad()),
        };
        rest = &rest[u..];
        secs += v * unit;
    }
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// An age (`7d`: that long before now) or a date (`2026-01-02`, local
/// midnight; `2026-01-02 15:04:05` or with a `T`, local time; RFC 3339
/// with an offset, `2026-01-02T15:04:05Z`), as nanoseconds since the epoch.
pub fn parse_when(s: &str) -> Result<i128, String> {
    parse_when_at(s, Timestamp::now())
}

fn parse_when_at(s: &str, now: Timestamp) -> Result<i128, String> {
    let t = s.trim();
    if let Ok(d) = parse_duration(t) {
        return Ok(now.as_nanosecond() - d.as_nanos() as i128);
    }
    let local = |dt: DateTime| {
        dt.to_zoned(TimeZone::system())
            .map(|z| z.timestamp().as_nanosecond())
            .map_err(|e| format!("{s:?}: {e}"))
    };
    if let Ok(ts) = t.parse::<Timestamp>() {
        return Ok(ts.as_nanosecond());
    }
    if let Ok(dt) = t.parse::<DateTime>() {
        return local(dt);
    }
    if let Ok(d) = t.parse::<Date>() {
        return local(d.to_datetime(jiff::civil::Time::midnight()));
    }
    Err(format!(
        "{s:?}: not an age (e.g. 30s, 10m, 2h, 7d, 2w) or a date (2026-01-02, 2026-01-02T15:04:05Z)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let d = |s| parse_duration(s).unwrap().as_secs_f64();
        assert_eq!(d("90"), 90.0);
        assert_eq!(d("0"), 0.0);
        assert_eq!(d("30s"), 30.0);
        assert_eq!(d("10m"), 600.0);
        assert_eq!(d("2h"), 7200.0);
        assert_eq!(d("7d"), 604_800.0);
        assert_eq!(d("2w"), 1_209_600.0);
        assert_eq!(d("1h30m"), 5400.0);
        assert_eq!(d("1.5h"), 5400.0);
        assert_eq!(d("500ms"), 0.5);
        assert_eq!(d("1M"), 2_592_000.0);
        for bad in ["", " ", "yesterday", "5x", "h", "1h 2m", "-1s", "1..5h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ages_and_dates() {
        let now: Timestamp = "2026-03-01T00:00:00Z".parse().unwrap();
        let at = |s| parse_when_at(s, now).unwrap();
        let secs = |s: &str| s.parse::<Timestamp>().unwrap().as_nanosecond();
        assert_eq!(at("1d"), secs("2026-02-28T00:00:00Z"));
        assert_eq!(at("2w"), secs("2026-02-15T00:00:00Z"));
        assert_eq!(at("2026-01-02T03:04:05Z"), secs("2026-01-02T03:04:05Z"));
        assert_eq!(
            at("2026-01-02T03:04:05+01:00"),
            secs("2026-01-02T02:04:05Z")
        );
        let local = |s: &str| {
            s.parse::<DateTime>()
                .unwrap()
                .to_zoned(TimeZone::system())
                .unwrap()
                .timestamp()
                .as_nanosecond()
        };
        assert_eq!(at("2026-01-02"), local("2026-01-02T00:00:00"));
        assert_eq!(at("2026-01-02 15:04:05"), local("2026-01-02T15:04:05"));
        for bad in ["yesterday", "2026-13-01", "2026-01-02X", ""] {
            assert!(parse_when_at(bad, now).is_err(), "{bad}");
        }
    }
}
