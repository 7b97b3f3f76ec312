//! Times as a user gives them (`--at`) and as ferry shows them.

use super::*;

/// `YYYY-MM-DD HH:MM:SS` in the local time zone `tz`.
pub(super) fn local_time(unix: i64, tz: &TimeZone) -> String {
    match Timestamp::from_second(unix) {
        Ok(t) => t
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%d %H:%M:%S")
            .to_string(),
        Err(_) => unix.to_string(),
    }
}

/// The time of `--at`, in Unix seconds, `now` being the clock and `tz`
/// the local time zone:
/// - `now`, `today` (its midnight), `yesterday` (this time yesterday),
///   `today 09:00`, `yesterday 17:30`;
/// - a time of day `04:55[:30]`: the last one that has passed (today's,
///   or yesterday's when today's is still to come);
/// - a local date and time `2026-11-25 16:33[:43]` (or with a `T`), a
///   local date `2026-11-25` (its midnight);
/// - RFC 3339 with a zone: `2026-11-25T16:33:43Z`, `...+01:00`;
/// - a version's stamp `20261125-163343` (UTC, as in its name);
/// - an age: `2h`, `90m`, `3d`, `1h30m`, `2w`, optionally followed by
///   `ago`.
pub fn parse_at(s: &str, now: i64, tz: &TimeZone) -> Result<i64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let bad = || {
        format!(
            "--at {s:?}: not a time (2026-11-25 16:33, 2026-11-25, 16:33, yesterday, 2h, 2026-11-25T16:33:43Z, 20261125-163343)"
        )
    };
    let now_z = Timestamp::from_second(now)
        .map_err(|e| format!("--at {s:?}: {e}"))?
        .to_zoned(tz.clone());
    let zoned = |dt: DateTime| -> Result<i64, String> {
        dt.to_zoned(tz.clone())
            .map(|z| z.timestamp().as_second())
            .map_err(|e| format!("--at {s:?}: {e}"))
    };
    let time_of = |x: &str| -> Option<Time> {
        let x = x.trim();
        // Only a time of day (jiff would take the time out of a date and
        // time as well).
        if !x.contains(':')
            || !x
                .chars()
                .all(|c| c.is_ascii_digit() || c == ':' || c == '.')
        {
            return None;
        }
        // `9:05` as well as `09:05`.
        let padded;
        let x = if x.find(':') == Some(1) {
            padded = format!("0{x}");
            padded.as_str()
        } else {
            x
        };
        x.parse::<Time>().ok()
    };
    if let Some(x) = ferry_engine::keep::parse_stamp(t.as_bytes()) {
        return Ok(x);
    }
    let mut words = lower.splitn(2, ' ');
    let (w0, rest) = (words.next().unwrap_or(""), words.next());
    let day = match w0 {
        "now" if rest.is_none() => return Ok(now),
        "today" => Some(now_z.date()),
        "yesterday" => Some(now_z.date().yesterday().map_err(|e| e.to_string())?),
        _ => None,
    };
    if let Some(d) = day {
        return match rest {
            Some(r) => zoned(d.to_datetime(time_of(r).ok_or_else(bad)?)),
            None if w0 == "today" => zoned(d.to_datetime(Time::midnight())),
            // This time yesterday.
            None => zoned(d.to_datetime(now_z.time())),
        };
    }
    let age = lower.strip_suffix("ago").map(str::trim).unwrap_or(&lower);
    if age.chars().next().is_some_and(|c| c.is_ascii_digit()) && !age.contains([':', '-']) {
        if let Ok(d) = crate::filter_args::parse_duration(age) {
            return Ok(now - d.as_secs() as i64);
        }
    }
    if let Some(tm) = time_of(t) {
        let today = zoned(now_z.date().to_datetime(tm))?;
        if today <= now {
            return Ok(today);
        }
        let y = now_z.date().yesterday().map_err(|e| e.to_string())?;
        return zoned(y.to_datetime(tm));
    }
    if let Ok(ts) = t.parse::<Timestamp>() {
        return Ok(ts.as_second());
    }
    if let Ok(dt) = t.parse::<DateTime>() {
        return zoned(dt);
    }
    if let Ok(d) = t.parse::<Date>() {
        return zoned(d.to_datetime(Time::midnight()));
    }
    Err(bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_for_at() {
        let now = 1_795_624_423; // 2026-11-25 16:33:43 UTC, a Wednesday
        let utc = TimeZone::UTC;
        let at = |s| parse_at(s, now, &utc).unwrap();
        assert_eq!(at("20261125-163343"), now);
        assert_eq!(at("2026-11-25T16:33:43Z"), now);
        assert_eq!(at("2026-11-25T17:33:43+01:00"), now);
        assert_eq!(at("2026-11-25 16:33:43"), now);
        assert_eq!(at("2026-11-25 16:33"), now - 43);
        assert_eq!(at("2026-11-25"), now - (16 * 3600 + 33 * 60 + 43));
        assert_eq!(at("2h"), now - 7200);
        assert_eq!(at("2h ago"), now - 7200);
        assert_eq!(at("1h30m"), now - 5400);
        assert_eq!(at("3d"), now - 3 * 86_400);
        assert_eq!(at("now"), now);
        assert_eq!(at("yesterday"), now - 86_400);
        assert_eq!(at("Yesterday 16:00"), now - 86_400 - 33 * 60 - 43);
        assert_eq!(at("today"), now - (16 * 3600 + 33 * 60 + 43));
        // A time of day: the last that has passed.
        assert_eq!(at("16:00"), now - 33 * 60 - 43);
        assert_eq!(at("4:55"), now - (11 * 3600 + 38 * 60 + 43));
        assert_eq!(at("17:00"), now - 86_400 + 26 * 60 + 17);
        for bad in ["soon", "25:00", "2026-13-01", "yesterday noon", ""] {
            assert!(parse_at(bad, now, &utc).is_err(), "{bad}");
        }
        // Local times are the zone's: 16:33:43 UTC is 17:33:43 in UTC+1.
        let plus1 = TimeZone::fixed(jiff::tz::offset(1));
        assert_eq!(parse_at("2026-11-25 17:33:43", now, &plus1).unwrap(), now);
        assert_eq!(parse_at("17:33:43", now, &plus1).unwrap(), now);
        assert_eq!(local_time(now, &plus1), "2026-11-25 17:33:43");
    }

    #[test]
    fn paths_never_leave_the_replica() {
        for ok in [&b""[..], b"f", b"d/f", b".f/..g", b"a/...", b"a b/c"] {
            assert!(plain_rel(ok), "{:?}", String::from_utf8_lossy(ok));
        }
        for bad in [&b".."[..], b"d/../f", b"./f", b"d//f", b"d/", b"/d", b"d/."] {
            assert!(!plain_rel(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(1_795_624_423), "2026-11-25 16:33:43");
    }
}
