//! The `agentmesh.v1.Settings` service: a node's runtime settings (`mesh-cli config show`,
//! `config set`, `config unset`). It translates; `settings::Settings` checks, keeps and applies a
//! change, and the admission policy decides who may make one (`Admission::may_operate`: an
//! operator). Anyone with a certificate may read them; in insecure mode there are no
//! identities, and every caller may change them.

use std::sync::Arc;

use mesh_proto::{convert::check_len, v1 as pb};
use tonic::{Request, Response, Status};

use crate::{
    admission::{Admission, Operation},
    config::{MAX_VALUE_BYTES, Shown},
    settings::{Settings, SettingsError},
};

/// Longest key accepted.
const MAX_KEY_BYTES: usize = 64;

/// The Settings service.
#[derive(Debug, Clone)]
pub(crate) struct SettingsService {
    settings: Arc<Settings>,
    /// Decides who is an operator.
    admission: Arc<Admission>,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl SettingsService {
    /// Serves `settings`; `admission` decides who may change them.
    pub(crate) fn new(settings: Arc<Settings>, admission: Arc<Admission>, tls: bool) -> Self {
        Self {
            settings,
            admission,
            tls,
        }
    }

    /// The tonic server, with message size limits.
    pub(crate) fn into_server(self) -> pb::settings_server::SettingsServer<Self> {
        pb::settings_server::SettingsServer::new(self)
            .max_decoding_message_size(16 * 1024)
            .max_encoding_message_size(super::MAX_MESSAGE_BYTES)
    }

    /// Refuses a caller who may not change settings.
    fn operator<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if !self.tls {
            return Ok(());
        }
        let principal = super::caller_identity(request)?.principal();
        self.admission
            .may_operate(&principal, Operation::Settings)
            .map_err(|e| Status::permission_denied(e.to_string()))
    }
}

/// Every settings error has one status code.
impl From<SettingsError> for Status {
    fn from(error: SettingsError) -> Self {
        let message = error.to_string();
        match error {
            SettingsError::Invalid(_) => Status::invalid_argument(message),
            SettingsError::Save { .. } => Status::unavailable(message),
        }
    }
}

/// A TOML value as JSON text (empty for none).
fn json(value: Option<&toml::Value>) -> String {
    value
        .and_then(|value| serde_json::to_string(value).ok())
        .unwrap_or_default()
}

fn setting_pb(shown: &Shown) -> pb::Setting {
    pb::Setting {
        key: shown.key.to_owned(),
        about: shown.about.to_owned(),
        value_json: json(Some(&shown.value)),
        source: shown.source.as_str().to_owned(),
        file_json: json(shown.file.as_ref()),
        runtime_json: json(shown.runtime.as_ref()),
    }
}

#[tonic::async_trait]
impl pb::settings_server::Settings for SettingsService {
    async fn show(
        &self,
        _request: Request<pb::SettingsShowRequest>,
    ) -> Result<Response<pb::SettingsShowResponse>, Status> {
        Ok(Response::new(pb::SettingsShowResponse {
            settings: self.settings.show().iter().map(setting_pb).collect(),
        }))
    }

    async fn set(
        &self,
        request: Request<pb::SettingsSetRequest>,
    ) -> Result<Response<pb::Setting>, Status> {
        self.operator(&request)?;
        let r = request.into_inner();
        check_len("key", &r.key, MAX_KEY_BYTES)?;
        check_len("value", &r.value, MAX_VALUE_BYTES)?;
        let shown = self.settings.set(&r.key, &r.value)?;
        Ok(Response::new(setting_pb(&shown)))
    }

    async fn unset(
        &self,
        request: Request<pb::SettingsUnsetRequest>,
    ) -> Result<Response<pb::Setting>, Status> {
        self.operator(&request)?;
        let key = request.into_inner().key;
        check_len("key", &key, MAX_KEY_BYTES)?;
        let shown = self.settings.unset(&key)?;
        Ok(Response::new(setting_pb(&shown)))
    }
}
