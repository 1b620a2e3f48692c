/**
 * Hide the password in a Postgres connection string, both `user:pass@` and `?password=`, so a URL can
 * go into a log line or an error. Strings that do not parse as URLs are redacted by pattern.
 */
export function redactConnectionString(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = "***";
    for (const key of [...parsed.searchParams.keys()]) {
      if (/^(password|pass|pwd|sslpassword)$/i.test(key)) parsed.searchParams.set(key, "***");
    }
    return parsed.toString().replaceAll("%2A%2A%2A", "***");
  } catch {
    return url.replace(/(:\/\/[^:/@]*:)[^@]*@/, "$1***@").replace(/(password=)[^&\s]*/gi, "$1***");
  }
}

/** Replace every occurrence of known secrets in free text (an error message that echoes a URL, say). */
export function redactSecrets(text: string, secrets: readonly (string | undefined)[]): string {
  let out = text;
  for (const secret of secrets) {
    if (secret && secret.length >= 3) out = out.replaceAll(secret, "***");
  }
  return out;
}
