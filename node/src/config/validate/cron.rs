//! Checks `[cron]`: the caps on schedules, per creator and in all, by count and by MiB. It must
//! not know what a schedule is; it only checks the numbers.

use crate::config::{
    error::{ConfigError, Origin},
    raw::RawCron,
    types::CronLimits,
};

const MIB: usize = 1 << 20;

/// `[cron]`: counts from 1 to 100000, MiB from 1 to 1024.
pub(super) fn cron(raw: RawCron, origin: &Origin) -> Result<CronLimits, ConfigError> {
    let within = |key: &str, value: Option<usize>, default: usize, max: usize| match value {
        None => Ok(default),
        Some(v) if (1..=max).contains(&v) => Ok(v),
        Some(v) => Err(origin.invalid(
            key,
            format!("is {v}"),
            &format!("use a value from 1 to {max} (default {default})"),
        )),
    };
    Ok(CronLimits {
        max_schedules: within("cron.max_schedules", raw.max_schedules, 1000, 100_000)?,
        max_schedules_per_creator: within(
            "cron.max_schedules_per_creator",
            raw.max_schedules_per_creator,
            100,
            100_000,
        )?,
        max_bytes: within("cron.max_mb", raw.max_mb, 16, 1024)? * MIB,
        max_bytes_per_creator: within("cron.max_mb_per_creator", raw.max_mb_per_creator, 4, 1024)?
            * MIB,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::validate::tests::{err, parse};

    #[test]
    fn the_caps_default_to_the_documented_values_and_bad_ones_name_their_key() {
        let limits = parse("").expect("valid").cron;
        assert_eq!(
            (
                limits.max_schedules,
                limits.max_schedules_per_creator,
                limits.max_bytes,
                limits.max_bytes_per_creator
            ),
            (1000, 100, 16 << 20, 4 << 20)
        );
        let set = parse("[cron]\nmax_schedules = 50\nmax_mb_per_creator = 1").expect("valid");
        assert_eq!(set.cron.max_schedules, 50);
        assert_eq!(set.cron.max_bytes_per_creator, 1 << 20);
        for (text, key) in [
            ("[cron]\nmax_schedules = 0", "cron.max_schedules"),
            (
                "[cron]\nmax_schedules_per_creator = 100001",
                "cron.max_schedules_per_creator",
            ),
            ("[cron]\nmax_mb = 2048", "cron.max_mb"),
            ("[cron]\nmax_mb_per_creator = 0", "cron.max_mb_per_creator"),
        ] {
            let message = err(text);
            assert!(message.contains(&format!("`{key}`")), "{key}: {message}");
            assert!(message.contains("node.toml"), "{key}: {message}");
        }
        assert!(err("[cron]\nmax_count = 5").contains("max_count"));
    }
}
