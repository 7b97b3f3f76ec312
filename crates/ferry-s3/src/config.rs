//! Where the bucket is and who we are: `s3://bucket/prefix` plus the AWS
//! conventions users already have (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_PROFILE` with `~/.aws/credentials` and
//! `~/.aws/config`, `credential_process`), and `--s3-endpoint`. A custom
//! endpoint (Garage, MinIO) uses path-style addressing.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use rusty_s3::Credentials;
use url::Url;

/// Why a location cannot be used: the message names the URL, the file or
/// the profile, and the cause.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}: not an s3:// URL")]
    NotS3(String),
    #[error("{0}: no bucket name (expected s3://BUCKET/PREFIX)")]
    NoBucket(String),
    #[error("{url}: a key with a \"{segment}\" segment cannot be requested exactly (URLs remove such segments)")]
    DotSegment { url: String, segment: String },
    #[error("{0}: a key with an empty segment (\"//\") has no file path")]
    EmptySegment(String),
    #[error("S3 endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        source: url::ParseError,
    },
    #[error("s3://{bucket}: {source}")]
    Bucket {
        bucket: String,
        source: rusty_s3::BucketError,
    },
    #[error("{0}: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials)")]
    NoCredentials(String),
    #[error("{url}: AWS profile {profile} signs in with SSO, which ferry does not support (use a profile with credential_process = aws configure export-credentials --profile {profile} --format process)")]
    Sso { url: String, profile: String },
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("AWS profile {profile}: credential_process `{command}`: {why}")]
    Process {
        profile: String,
        command: String,
        why: String,
    },
}

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
pub fn parse_s3_url(s: &str) -> Option<Result<(String, String), ConfigError>> {
    let rest = s.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Some(Err(ConfigError::NoBucket(s.to_string())));
    }
    if let Some(seg) = prefix.split('/').find(|s| *s == "." || *s == "..") {
        return Some(Err(ConfigError::DotSegment {
            url: s.to_string(),
            segment: seg.to_string(),
        }));
    }
    // One rule for every path ferry makes of a key (listings skip such
    // keys): no empty segment (`a//b`, a leading `/`); one `/` may end it.
    let body = prefix.strip_suffix('/').unwrap_or(prefix);
    if prefix.starts_with('/') || !body.is_empty() && body.split('/').any(str::is_empty) {
        return Some(Err(ConfigError::EmptySegment(s.to_string())));
    }
    Some(Ok((
        bucket.to_string(),
        prefix.trim_start_matches('/').to_string(),
    )))
}

impl S3Config {
    /// Resolve the configuration of `s3://bucket/prefix` from the
    /// environment, the AWS files and `endpoint_flag` (`--s3-endpoint`).
    pub fn from_url(url: &str, endpoint_flag: Option<&str>) -> Result<S3Config, ConfigError> {
        Self::resolve(url, endpoint_flag, &|k| {
            std::env::var(k).ok().filter(|v| !v.is_empty())
        })
    }

    /// [`from_url`](Self::from_url) with the environment read through `env`.
    fn resolve(
        url: &str,
        endpoint_flag: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<S3Config, ConfigError> {
        let (bucket, prefix) =
            parse_s3_url(url).ok_or_else(|| ConfigError::NotS3(url.to_string()))??;
        let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
        let home = env("HOME").map(PathBuf::from);
        let creds_file = env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws/credentials")));
        let config_file = env("AWS_CONFIG_FILE")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws/config")));
        // The credentials file names a profile `[name]`, the config file
        // `[profile name]` (`[default]` for the default one).
        let file_creds = match creds_file {
            Some(p) => read_ini(&p)?.and_then(|mut m| m.remove(&profile)),
            None => None,
        };
        let file_conf = match config_file {
            Some(p) => read_ini(&p)?.and_then(|mut m| {
                m.remove(&format!("profile {profile}"))
                    .or_else(|| m.remove(&profile))
            }),
            None => None,
        };
        let from_files = |k: &str| {
            file_creds
                .as_ref()
                .and_then(|m| m.get(k).cloned())
                .or_else(|| file_conf.as_ref().and_then(|m| m.get(k).cloned()))
        };

        let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(k), Some(s)) => Some(credentials(k, s, env("AWS_SESSION_TOKEN"))),
            _ => match (
                from_files("aws_access_key_id"),
                from_files("aws_secret_access_key"),
            ) {
                (Some(k), Some(s)) => Some(credentials(k, s, from_files("aws_session_token"))),
                _ => match from_files("credential_process") {
                    Some(command) => Some(run_process(&profile, &command)?),
                    None => None,
                },
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
        let endpoint = Url::parse(&endpoint).map_err(|source| ConfigError::Endpoint {
            endpoint: endpoint.clone(),
            source,
        })?;
        if credentials.is_none() {
            if from_files("sso_session").is_some() || from_files("sso_start_url").is_some() {
                return Err(ConfigError::Sso {
                    url: url.to_string(),
                    profile,
                });
            }
            return Err(ConfigError::NoCredentials(url.to_string()));
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

fn credentials(key: String, secret: String, token: Option<String>) -> Credentials {
    match token {
        Some(t) => Credentials::new_with_token(key, secret, t),
        None => Credentials::new(key, secret),
    }
}

/// Sections of an AWS INI file: name → key (lower case) → value.
type Sections = HashMap<String, HashMap<String, String>>;

/// The sections of an AWS INI file, `None` when it does not exist. The rules are the AWS CLI's: `#` and `;`
/// start comment lines (indented or not), not comments after a value.
fn read_ini(path: &Path) -> Result<Option<Sections>, ConfigError> {
    let bad = |why: String| ConfigError::File {
        path: path.to_path_buf(),
        why,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    // Section names are case-sensitive (profile names), keys are not.
    let mut rules = configparser::ini::IniDefault::default();
    rules.case_sensitive = true;
    rules.enable_inline_comments = false;
    let map = configparser::ini::Ini::new_from_defaults(rules)
        .read(text)
        .map_err(bad)?;
    Ok(Some(
        map.into_iter()
            .map(|(section, keys)| {
                let keys = keys
                    .into_iter()
                    .map(|(k, v)| (k.to_lowercase(), v.unwrap_or_default()))
                    .collect();
                (section, keys)
            })
            .collect(),
    ))
}

/// What a `credential_process` prints (the AWS CLI's format, version 1).
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProcessOutput {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

/// Credentials from profile `profile`'s `credential_process`: the command
/// runs once per run (by `sh -c`), its JSON is read from its output.
fn run_process(profile: &str, command: &str) -> Result<Credentials, ConfigError> {
    static DONE: OnceLock<Mutex<HashMap<String, Credentials>>> = OnceLock::new();
    let done = DONE.get_or_init(Mutex::default);
    if let Some(c) = done.lock().get(command) {
        return Ok(c.clone());
    }
    let fail = |why: String| ConfigError::Process {
        profile: profile.to_string(),
        command: command.to_string(),
        why,
    };
    let out = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        return Err(fail(match last {
            Some(l) => format!("{}: {}", out.status, l.trim()),
            None => out.status.to_string(),
        }));
    }
    let c = parse_process_output(&out.stdout, jiff::Timestamp::now()).map_err(fail)?;
    done.lock().insert(command.to_string(), c.clone());
    Ok(c)
}

/// Credentials from a `credential_process`'s output, refused when they
/// have expired by `now`.
fn parse_process_output(out: &[u8], now: jiff::Timestamp) -> Result<Credentials, String> {
    let p: ProcessOutput =
        serde_json::from_slice(out).map_err(|e| format!("unreadable output: {e}"))?;
    if p.version != 1 {
        return Err(format!("output Version {} (ferry reads 1)", p.version));
    }
    if let Some(exp) = &p.expiration {
        let t: jiff::Timestamp = exp
            .parse()
            .map_err(|e| format!("unreadable Expiration {exp:?}: {e}"))?;
        if t <= now {
            return Err(format!("the credentials expired at {exp}"));
        }
    }
    Ok(credentials(
        p.access_key_id,
        p.secret_access_key,
        p.session_token,
    ))
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
        // Empty segments name no file path either; one trailing `/` is no segment.
        for bad in [
            "s3://b/t5//lead",
            "s3://b//x",
            "s3://b/a//",
            "s3://b//",
            "s3://b/a/b//c/",
        ] {
            assert_eq!(
                parse_s3_url(bad).unwrap().unwrap_err().to_string(),
                format!("{bad}: a key with an empty segment (\"//\") has no file path"),
            );
        }
        for good in ["s3://b/", "s3://b/a/", "s3://b/a/b"] {
            assert!(parse_s3_url(good).unwrap().is_ok(), "{good}");
        }
        assert_eq!(
            parse_s3_url("s3://b/a/../x").unwrap().unwrap_err().to_string(),
            "s3://b/a/../x: a key with a \"..\" segment cannot be requested exactly (URLs remove such segments)"
        );
        assert_eq!(
            parse_s3_url("s3:///x").unwrap().unwrap_err().to_string(),
            "s3:///x: no bucket name (expected s3://BUCKET/PREFIX)"
        );
    }

    /// A home with `~/.aws/credentials` and `~/.aws/config`, and an
    /// environment of `vars` plus `HOME`.
    struct Home {
        dir: tempfile::TempDir,
        vars: HashMap<String, String>,
    }

    impl Home {
        fn new(credentials: &str, config: &str, vars: &[(&str, &str)]) -> Home {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join(".aws")).unwrap();
            std::fs::write(dir.path().join(".aws/credentials"), credentials).unwrap();
            std::fs::write(dir.path().join(".aws/config"), config).unwrap();
            let mut vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            vars.insert("HOME".into(), dir.path().to_str().unwrap().into());
            Home { dir, vars }
        }

        fn resolve(&self) -> Result<S3Config, ConfigError> {
            S3Config::resolve("s3://b/p", None, &|k| self.vars.get(k).cloned())
        }
    }

    fn key_of(c: &S3Config) -> (&str, &str, Option<&str>) {
        let c = c.credentials.as_ref().unwrap();
        (c.key(), c.secret(), c.token())
    }

    #[test]
    fn profiles_from_both_files() {
        let creds = "# comment\n[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n\
[Dev]\n  ; indented comment\nAWS_Access_Key_ID=DEVKEY\naws_secret_access_key = a/b+c=d#e\naws_session_token = tok\n";
        let config = "[default]\nregion = eu-west-1\n\n[profile Dev]\nregion = us-west-2\n\
endpoint_url = http://127.0.0.1:3900\n[profile dev]\nregion = lower-case-profile\n";
        let h = Home::new(creds, config, &[]);
        let c = h.resolve().unwrap();
        assert_eq!(key_of(&c), ("DEF", "defsecret", None));
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.endpoint.as_str(), "https://s3.eu-west-1.amazonaws.com/");
        assert!(!c.path_style);
        // `[profile Dev]` in config, `[Dev]` in credentials; names keep
        // their case, keys do not; a value keeps its `=` and `#`.
        let h = Home::new(creds, config, &[("AWS_PROFILE", "Dev")]);
        let c = h.resolve().unwrap();
        assert_eq!(key_of(&c), ("DEVKEY", "a/b+c=d#e", Some("tok")));
        assert_eq!(c.region, "us-west-2");
        assert_eq!(c.endpoint.as_str(), "http://127.0.0.1:3900/");
        assert!(c.path_style);
        // The environment wins over the files.
        let h = Home::new(
            creds,
            config,
            &[
                ("AWS_PROFILE", "Dev"),
                ("AWS_ACCESS_KEY_ID", "ENV"),
                ("AWS_SECRET_ACCESS_KEY", "envsecret"),
                ("AWS_REGION", "ap-south-1"),
            ],
        );
        let c = h.resolve().unwrap();
        assert_eq!(key_of(&c), ("ENV", "envsecret", None));
        assert_eq!(c.region, "ap-south-1");
        // A profile nobody defines: no credentials.
        let h = Home::new(creds, config, &[("AWS_PROFILE", "nobody")]);
        assert_eq!(
            h.resolve().unwrap_err().to_string(),
            "s3://b/p: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials)"
        );
    }

    #[test]
    fn missing_files_are_no_profile_and_broken_ones_an_error() {
        let h = Home::new(
            "",
            "",
            &[("AWS_ACCESS_KEY_ID", "K"), ("AWS_SECRET_ACCESS_KEY", "S")],
        );
        std::fs::remove_file(h.dir.path().join(".aws/config")).unwrap();
        assert_eq!(h.resolve().unwrap().region, "us-east-1");
        let h = Home::new("[default\naws_access_key_id = x\n", "", &[]);
        let e = h.resolve().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}/.aws/credentials: line 1", h.vars["HOME"])),
            "{e}"
        );
    }

    #[test]
    fn credential_process_success() {
        let json = r#"{"Version": 1, "AccessKeyId": "PK", "SecretAccessKey": "ps", "SessionToken": "pt", "Expiration": "2999-01-01T00:00:00Z"}"#;
        let config =
            format!("[profile p]\ncredential_process = printf '%s' '{json}'\nregion = r\n");
        let h = Home::new("", &config, &[("AWS_PROFILE", "p")]);
        let c = h.resolve().unwrap();
        assert_eq!(key_of(&c), ("PK", "ps", Some("pt")));
        assert_eq!(c.region, "r");
        // Static keys in the profile come first.
        let creds = "[p]\naws_access_key_id = S\naws_secret_access_key = s\n";
        let h = Home::new(creds, &config, &[("AWS_PROFILE", "p")]);
        assert_eq!(key_of(&h.resolve().unwrap()), ("S", "s", None));
    }

    #[test]
    fn credential_process_failures_name_the_profile_and_the_command() {
        let h = Home::new(
            "[q]\ncredential_process = echo first >&2; echo token expired >&2; exit 3\n",
            "",
            &[("AWS_PROFILE", "q")],
        );
        assert_eq!(
            h.resolve().unwrap_err().to_string(),
            "AWS profile q: credential_process `echo first >&2; echo token expired >&2; exit 3`: exit status: 3: token expired"
        );
        let h = Home::new(
            "[q]\ncredential_process = echo not json\n",
            "",
            &[("AWS_PROFILE", "q")],
        );
        let e = h.resolve().unwrap_err().to_string();
        assert!(
            e.starts_with("AWS profile q: credential_process `echo not json`: unreadable output: "),
            "{e}"
        );
    }

    #[test]
    fn credential_process_output() {
        let now: jiff::Timestamp = "2024-06-01T00:00:00Z".parse().unwrap();
        let c = parse_process_output(
            br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S"}"#,
            now,
        )
        .unwrap();
        assert_eq!((c.key(), c.secret(), c.token()), ("A", "S", None));
        let expired = br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S","SessionToken":"T","Expiration":"2024-05-31T23:59:59Z"}"#;
        assert_eq!(
            parse_process_output(expired, now).unwrap_err(),
            "the credentials expired at 2024-05-31T23:59:59Z"
        );
        let later = br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"2024-06-01T01:00:00+00:00"}"#;
        assert!(parse_process_output(later, now).is_ok());
        let v2 = br#"{"Version":2,"AccessKeyId":"A","SecretAccessKey":"S"}"#;
        assert_eq!(
            parse_process_output(v2, now).unwrap_err(),
            "output Version 2 (ferry reads 1)"
        );
        assert!(parse_process_output(br#"{"Version":1,"AccessKeyId":"A"}"#, now).is_err());
        assert!(parse_process_output(
            br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"soon"}"#,
            now
        )
        .is_err());
    }

    #[test]
    fn sso_profiles_say_what_to_do() {
        let config = "[profile s]\nsso_session = corp\nsso_account_id = 1\nregion = r\n";
        let h = Home::new("", config, &[("AWS_PROFILE", "s")]);
        assert_eq!(
            h.resolve().unwrap_err().to_string(),
            "s3://b/p: AWS profile s signs in with SSO, which ferry does not support (use a profile with credential_process = aws configure export-credentials --profile s --format process)"
        );
    }
}
