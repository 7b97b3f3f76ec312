//! Where the bucket is and who we are: `s3://bucket/prefix` plus the AWS
//! conventions users already have (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_PROFILE` with `~/.aws/credentials` and
//! `~/.aws/config`), and `--s3-endpoint`. A custom endpoint (Garage, MinIO)
//! uses path-style addressing.

use std::collections::HashMap;
use std::path::PathBuf;

use rusty_s3::Credentials;
use url::Url;

/// Everything needed to reach one bucket prefix.
#[derive(Clone, Debug)]
pub struct S3Config {
    /// Service endpoint (scheme + host + port).
    pub endpoint: Url,
    /// Signing region.
    pub region: String,
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket (no leading `/`).
    pub prefix: String,
    /// Static credentials (none: anonymous requests).
    pub credentials: Option<Credentials>,
    /// Path-style URLs (`endpoint/bucket/key`) rather than virtual-host.
    pub path_style: bool,
}

/// `s3://bucket/prefix` → `(bucket, prefix)`; `None` if not an S3 URL.
pub fn parse_s3_url(s: &str) -> Option<Result<(String, String), String>> {
    let rest = s.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Some(Err(format!(
            "{s}: no bucket name (expected s3://BUCKET/PREFIX)"
        )));
    }
    if let Some(seg) = prefix.split('/').find(|s| *s == "." || *s == "..") {
        return Some(Err(format!(
            "{s}: a key with a \"{seg}\" segment cannot be requested exactly (URLs remove such segments)"
        )));
    }
    Some(Ok((
        bucket.to_string(),
        prefix.trim_start_matches('/').to_string(),
    )))
}

impl S3Config {
    /// Resolve the configuration of `s3://bucket/prefix` from the
    /// environment, the AWS files and `endpoint_flag` (`--s3-endpoint`).
    pub fn from_url(url: &str, endpoint_flag: Option<&str>) -> Result<S3Config, String> {
        let (bucket, prefix) =
            parse_s3_url(url).ok_or_else(|| format!("{url}: not an s3:// URL"))??;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
        let home = env("HOME").map(PathBuf::from);
        let creds_file = env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws/credentials")));
        let config_file = env("AWS_CONFIG_FILE")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws/config")));
        let file_creds = creds_file
            .and_then(|p| read_ini(&p))
            .and_then(|mut m| m.remove(&profile));
        let file_conf = config_file.and_then(|p| read_ini(&p)).and_then(|mut m| {
            m.remove(&format!("profile {profile}"))
                .or_else(|| m.remove(&profile))
        });
        let from_files = |k: &str| {
            file_creds
                .as_ref()
                .and_then(|m| m.get(k).cloned())
                .or_else(|| file_conf.as_ref().and_then(|m| m.get(k).cloned()))
        };

        let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(k), Some(s)) => Some(match env("AWS_SESSION_TOKEN") {
                Some(t) => Credentials::new_with_token(k, s, t),
                None => Credentials::new(k, s),
            }),
            _ => match (
                from_files("aws_access_key_id"),
                from_files("aws_secret_access_key"),
            ) {
                (Some(k), Some(s)) => Some(match from_files("aws_session_token") {
                    Some(t) => Credentials::new_with_token(k, s, t),
                    None => Credentials::new(k, s),
                }),
                _ => None,
            },
        };
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| from_files("region"))
            .unwrap_or_else(|| "us-east-1".to_string());
        let custom = endpoint_flag
            .map(str::to_string)
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| from_files("endpoint_url"));
        let path_style = custom.is_some();
        let endpoint = custom.unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let endpoint =
            Url::parse(&endpoint).map_err(|e| format!("S3 endpoint {endpoint:?}: {e}"))?;
        if credentials.is_none() {
            return Err(format!(
                "{url}: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials)"
            ));
        }
        Ok(S3Config {
            endpoint,
            region,
            bucket,
            prefix,
            credentials,
            path_style,
        })
    }
}

/// A minimal INI reader for the AWS files: `[section]` and `key = value`.
fn read_ini(path: &PathBuf) -> Option<HashMap<String, HashMap<String, String>>> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.trim().to_string();
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.entry(section.clone())
                .or_default()
                .insert(k.trim().to_lowercase(), v.trim().to_string());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_s3_url("s3://b/p/q").unwrap().unwrap(),
            ("b".into(), "p/q".into())
        );
        assert_eq!(
            parse_s3_url("s3://b").unwrap().unwrap(),
            ("b".into(), "".into())
        );
        assert!(parse_s3_url("s3:///x").unwrap().is_err());
        assert!(parse_s3_url("/tmp/x").is_none());
        // Dot segments would be normalised away in the request URL.
        assert!(parse_s3_url("s3://b/a/../x").unwrap().is_err());
        assert!(parse_s3_url("s3://b/trav/..").unwrap().is_err());
        assert!(parse_s3_url("s3://b/./x").unwrap().is_err());
        assert!(parse_s3_url("s3://b/a..b/.x/").unwrap().is_ok());
    }
}
