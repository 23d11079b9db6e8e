//! [`DoorCaller`]: who is calling the front door, as `http`'s authentication found out; what the
//! gateway admits, charges and lets own stored conversations.

use crate::api_keys::KeyGrant;

/// Who is calling the front door, as its authentication found out.
#[derive(Debug, Clone, Default)]
pub(crate) struct DoorCaller {
    /// The API key and its policy, when the front door needs keys.
    pub(crate) key: Option<KeyGrant>,
}

impl DoorCaller {
    /// The name of the caller's key, when the front door needs keys.
    pub(crate) fn key_name(&self) -> Option<&str> {
        self.key.as_ref().map(|grant| grant.name.as_str())
    }

    /// The id of the caller's key ([`crate::api_keys::key_id`]), when the front door needs
    /// keys: what owns what the caller stores.
    pub(crate) fn key_id(&self) -> Option<&str> {
        self.key.as_ref().map(|grant| grant.id.as_str())
    }
}
